package daemon

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// stepSight advances one interval and steps every daemon of the pair, campaign included; the
// daemons in blind get no scrape (their signals go stale: blind).
func (p *haPair) stepSight(blind ...int) {
	p.t.Helper()
	p.advance(stepEvery)
	for i, d := range p.ds {
		e := p.envs[i]
		e.dep.advance(stepEvery)
		seen := true
		for _, b := range blind {
			seen = seen && b != i
		}
		if seen {
			e.dep.feed(p.t, d, d.clock.Now())
		}
		d.campaignStep(context.Background())
		d.Step(context.Background())
	}
}

// TestHABlindHandsOver: the acting daemon that has been blind for BlindHandover while the
// standby sees gives the lease up, and the standby that sees takes it; the blind one does not
// take it back while it is blind, nor once it sees again (no flapping). Before that, a blip of
// blindness shorter than BlindHandover changes nothing.
func TestHABlindHandsOver(t *testing.T) {
	p := newHAPair(t, "a", "b")
	a, b := p.ds[0], p.ds[1]
	for range 4 {
		p.stepSight()
	}
	require.Equal(t, RoleActing, a.StatusNow().Role)
	require.Equal(t, RoleStandby, b.StatusNow().Role)

	// a's targets go quiet: stale after 3 intervals, blind; a minute later it hands over.
	var handedAt int
	for i := range 30 {
		p.stepSight(0)
		if a.StatusNow().Role == RoleStandby {
			handedAt = i + 1
			break
		}
		if i < 12 {
			require.Equal(t, RoleActing, a.StatusNow().Role, "step %d: a blip is no handover", i)
		}
	}
	require.NotZero(t, handedAt, "a never handed over: %+v", a.StatusNow().RoleReason)
	assert.GreaterOrEqual(t, handedAt, 15, "blind (3 intervals to stale) for a minute first")
	assert.Contains(t, a.StatusNow().RoleReason, "blind: blind for 1m")
	assert.Contains(t, a.StatusNow().RoleReason, "while b sees")
	assert.Equal(t, 1.0, counter(t, a, "basin_daemon_step_downs_total", "blind"))

	p.stepSight(0)
	assert.Equal(t, RoleActing, b.StatusNow().Role, "the standby that sees takes over")
	assert.Equal(t, uint64(2), b.StatusNow().Term)
	for range 20 {
		p.stepSight(0)
		require.Equal(t, RoleStandby, a.StatusNow().Role, "the blind daemon does not take the lease back")
	}
	for range 20 {
		p.stepSight()
		require.Equal(t, RoleActing, b.StatusNow().Role, "no flapping once a sees again")
		require.Equal(t, RoleStandby, a.StatusNow().Role)
	}
}

// TestHABlindKeepsTheLeaseWhenNobodySees: when the standby is blind too, the acting daemon keeps
// the lease however long it is blind — one daemon must still hold an incident cut and hear the
// alerts.
func TestHABlindKeepsTheLeaseWhenNobodySees(t *testing.T) {
	p := newHAPair(t, "a", "b")
	a, b := p.ds[0], p.ds[1]
	for range 4 {
		p.stepSight()
	}
	require.Equal(t, RoleActing, a.StatusNow().Role)
	for range 40 {
		p.stepSight(0, 1)
	}
	assert.Equal(t, RoleActing, a.StatusNow().Role)
	assert.Equal(t, RoleStandby, b.StatusNow().Role)
	assert.Equal(t, 0.0, counter(t, a, "basin_daemon_step_downs_total", "blind"))
}

// TestHABlindStandbyDoesNotCampaign: a blind standby does not take a free lease while another
// daemon sees: the one that sees takes it.
func TestHABlindStandbyDoesNotCampaign(t *testing.T) {
	p := newHAPair(t, "a", "b")
	a, b := p.ds[0], p.ds[1]
	for range 4 {
		p.stepSight(1)
	}
	require.Equal(t, RoleActing, a.StatusNow().Role)
	require.NoError(t, a.ha.camp.Release(context.Background())) // a stops acting cleanly
	// b campaigns first in each round, and the lease is free: it would win it.
	for range 3 {
		p.advance(stepEvery)
		b.campaignStep(context.Background())
		b.Step(context.Background())
		p.envs[0].dep.feed(t, a, a.clock.Now())
		a.campaignStep(context.Background())
		a.Step(context.Background())
	}
	assert.Equal(t, RoleStandby, b.StatusNow().Role, "blind, while a sees")
	assert.Equal(t, RoleActing, a.StatusNow().Role)
}
