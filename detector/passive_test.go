package detector

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPassiveKnee(t *testing.T) {
	def := Knee{Ratio: DefaultKneeRatio, PlateauHit: DefaultPlateauHit, Source: SourceDefault, PlateauSource: SourceDefault}
	// feed observes every 0.01 of W/C from lo to hi, samples times, with hit(W/C).
	feed := func(p *Passive, lo, hi float64, samples int, hit func(float64) float64) {
		for range samples {
			for i := int(lo*100 + 0.5); i <= int(hi*100+0.5); i++ {
				r := float64(i) / 100
				p.Observe(r, hit(r))
			}
		}
	}
	flat := func(h float64) func(float64) float64 { return func(float64) float64 { return h } }

	tests := []struct {
		name  string
		feed  func(p *Passive)
		want  Knee
		delta float64
	}{
		{
			name: "nothing seen: the default",
			feed: func(*Passive) {},
			want: def,
		},
		{
			name: "a few bins: the plateau is learnt, the knee is the default",
			feed: func(p *Passive) { feed(p, 0.40, 0.59, 4, flat(0.88)) }, // 4 bins × 5 samples × 4 = 20 each
			want: Knee{Ratio: DefaultKneeRatio, PlateauHit: 0.88, Source: SourceDefault, PlateauSource: SourcePassive},
		},
		{
			name: "too few samples per bin: nothing learnt",
			feed: func(p *Passive) { feed(p, 0.40, 1.99, 3, cliff(1.5)) }, // 15 samples per bin
			want: def,
		},
		{
			name: "a drop seen: the knee is learnt",
			feed: func(p *Passive) { feed(p, 0.40, 2.39, 4, cliff(1.5)) },
			// Bins are means of their samples, so the cliff is smeared by half a bin.
			want:  Knee{Ratio: 1.5, PlateauHit: 0.96, Source: SourcePassive, PlateauSource: SourcePassive},
			delta: 0.05,
		},
		{
			name: "no drop up to 1.2: the default knee stands, the plateau is learnt",
			feed: func(p *Passive) { feed(p, 0.40, 1.19, 4, flat(0.93)) },
			want: Knee{Ratio: DefaultKneeRatio, PlateauHit: 0.93, Source: SourceDefault, PlateauSource: SourcePassive},
		},
		{
			name: "no drop up to 2.3: the knee is at least there",
			feed: func(p *Passive) { feed(p, 0.40, 2.34, 4, flat(0.93)) },
			want: Knee{Ratio: 2.32, PlateauHit: 0.93, Source: SourcePassive, PlateauSource: SourcePassive, BeyondRange: true},
			// The last bin is [2.30, 2.35): the mean W/C of its samples 2.30…2.34.
			delta: 0.01,
		},
		{
			name: "out-of-range samples are ignored",
			feed: func(p *Passive) {
				for range 100 {
					p.Observe(0.5, 1.5)
					p.Observe(-1, 0.5)
					p.Observe(25, 0.5)
				}
			},
			want: def,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewPassive(PassiveOptions{})
			require.NoError(t, err)
			tc.feed(p)
			got := p.Knee(def, DefaultPressureExit*DefaultKneeRatio)
			assert.Equal(t, tc.want.Source, got.Source)
			assert.Equal(t, tc.want.PlateauSource, got.PlateauSource)
			assert.Equal(t, tc.want.BeyondRange, got.BeyondRange)
			assert.InDelta(t, tc.want.Ratio, got.Ratio, tc.delta+1e-9)
			assert.InDelta(t, tc.want.PlateauHit, got.PlateauHit, 1e-9+tc.delta/5)
		})
	}
}

// TestPassiveForgets checks a bin follows a changed workload: after its first samples it weighs
// new ones by Alpha, so a bin at 0.5 moves most of the way to 0.9 within a few hundred samples.
func TestPassiveForgets(t *testing.T) {
	p, err := NewPassive(PassiveOptions{MinSamples: 1, Alpha: 0.02})
	require.NoError(t, err)
	for range 1000 {
		p.Observe(0.5, 0.5)
	}
	for range 150 {
		p.Observe(0.5, 0.9)
	}
	pts := p.Points()
	require.Len(t, pts, 1)
	// 1 − 0.98^150 ≈ 0.952 of the way.
	assert.InDelta(t, 0.5+0.4*0.952, pts[0].HitRate, 0.005)
}

func TestPassiveOptions(t *testing.T) {
	for _, tc := range []struct {
		o    PassiveOptions
		want string
	}{
		{PassiveOptions{BinWidth: -0.1}, "Passive.BinWidth"},
		{PassiveOptions{MinBins: 2}, "Passive.MinBins"},
		{PassiveOptions{MinSamples: -1}, "Passive.MinSamples"},
		{PassiveOptions{Alpha: 2}, "Passive.Alpha"},
		{PassiveOptions{Tolerance: 1}, "Passive.Tolerance"},
	} {
		_, err := NewPassive(tc.o)
		assert.ErrorContains(t, err, tc.want)
	}
}
