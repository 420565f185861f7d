package scenario

import (
	"errors"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/sim"
)

// TestScenarioIsOnlyItsYAML: every exported field of a Scenario, down to the leaves, is a value a
// scenario file sets. Code (policies, observers, loggers) belongs in a Wiring: a func or an
// interface here would be shared by every copy WithoutSpikes makes and by every run built from
// it, and would be invisible in the file that claims to describe the run.
func TestScenarioIsOnlyItsYAML(t *testing.T) {
	seen := map[reflect.Type]bool{}
	var walk func(path string, typ reflect.Type)
	walk = func(path string, typ reflect.Type) {
		switch typ.Kind() {
		case reflect.Func, reflect.Interface, reflect.Chan, reflect.UnsafePointer:
			t.Errorf("%s is of kind %s: wiring, not configuration (put it in Wiring)", path, typ.Kind())
		case reflect.Pointer, reflect.Slice, reflect.Array, reflect.Map:
			walk(path+"[]", typ.Elem())
		case reflect.Struct:
			if seen[typ] {
				return
			}
			seen[typ] = true
			for f := range typ.Fields() {
				if !f.IsExported() {
					continue // filled by Load from the file (its directory, its trace)
				}
				tag, ok := f.Tag.Lookup("yaml")
				name, _, _ := strings.Cut(tag, ",")
				if !ok || name == "-" {
					t.Errorf("%s.%s: no yaml key, so no scenario file can set it", path, f.Name)
				}
				walk(path+"."+f.Name, f.Type)
			}
		}
	}
	walk("Scenario", reflect.TypeFor[Scenario]())
}

// fakePolicies knows one policy, "fake", and records the runs it configured.
type fakePolicies struct {
	err error

	mu      sync.Mutex
	streams []int // len(o.Streams) of each run Apply configured
}

func (f *fakePolicies) Names() []string { return []string{"fake"} }

func (f *fakePolicies) Apply(name string, o *sim.Options) (bool, error) {
	if name != "fake" {
		return false, nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.streams = append(f.streams, len(o.Streams))
	o.PriorityQueues = true
	return true, f.err
}

// observed marks the results of the runs an Observe func attached to.
type observed struct{}

func observe(o *sim.Options) error {
	o.OnResult = func(r *sim.Result) { r.Detector = observed{} }
	return nil
}

func TestWiringOptions(t *testing.T) {
	sc, err := Parse([]byte(spikeYAML))
	require.NoError(t, err)
	boom := errors.New("boom")
	cases := []struct {
		name     string
		wiring   Wiring
		policy   string
		want     sim.Policy
		applied  int // runs the fake policy set configured
		observed bool
		errs     []string // substrings of the error; nil: no error
	}{
		{name: "zero wiring builds the engine baseline", policy: "hicache", want: sim.PolicyHiCache},
		{name: "zero wiring knows no basin policy", policy: "fake", errs: []string{`unknown policy "fake"`}},
		{name: "policy set applied on top of none", wiring: Wiring{Policies: &fakePolicies{}}, policy: "fake",
			want: sim.PolicyNone, applied: 1},
		{name: "engine baselines still known with a policy set", wiring: Wiring{Policies: &fakePolicies{}},
			policy: "continuum", want: sim.PolicyContinuum},
		{name: "unknown policy lists the set's", wiring: Wiring{Policies: &fakePolicies{}}, policy: "magic",
			errs: []string{`unknown policy "magic"`, "fake"}},
		{name: "policy set error names the policy", wiring: Wiring{Policies: &fakePolicies{err: boom}},
			policy: "fake", errs: []string{"policy fake", "boom"}},
		{name: "observer attached", wiring: Wiring{Observe: observe}, policy: "none", want: sim.PolicyNone,
			observed: true},
		{name: "observer error", wiring: Wiring{Observe: func(*sim.Options) error { return boom }}, policy: "none",
			errs: []string{"observe", "boom"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o, err := tc.wiring.Options(sc, tc.policy)
			if tc.errs != nil {
				require.Error(t, err)
				for _, s := range tc.errs {
					assert.Contains(t, err.Error(), s)
				}
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, o.Policy)
			if fp, ok := tc.wiring.Policies.(*fakePolicies); ok {
				assert.Len(t, fp.streams, tc.applied)
			}
			assert.Equal(t, tc.applied > 0, o.PriorityQueues)
			assert.Equal(t, tc.observed, o.OnResult != nil)

			plain, err := sc.Options(string(tc.want))
			require.NoError(t, err)
			assert.False(t, plain.PriorityQueues, "Scenario.Options stays unwired")
			assert.Nil(t, plain.OnResult)
		})
	}
}

// TestWiringReachesTheSpikeFreeTwin: Run and Compare build the scenario's spike-free twin with the
// same wiring, so a policy's ratio compares it with itself, observed the same way.
func TestWiringReachesTheSpikeFreeTwin(t *testing.T) {
	sc, err := Parse([]byte(spikeYAML))
	require.NoError(t, err)
	fp := &fakePolicies{}
	w := Wiring{Policies: fp, Observe: observe}

	r, err := w.Run(sc, "fake", nil)
	require.NoError(t, err)
	assert.Equal(t, sim.Policy("fake"), r.Policy)
	assert.Equal(t, observed{}, r.Detector)
	assert.ElementsMatch(t, []int{3, 1}, fp.streams,
		"the spiked run (base, spike and extra streams) and its twin (the base stream)")

	res, err := w.Compare(sc, []string{"none", "fake"}, nil)
	require.NoError(t, err)
	require.Len(t, res, 2)
	for _, r := range res {
		assert.Equal(t, observed{}, r.Detector, "%s observed", r.Policy)
		require.NotNil(t, r.GoodputRatio)
	}
	assert.Len(t, fp.streams, 4, "Compare applied the set to fake's run and to its twin")

	plain, err := Run(sc, "none", nil)
	require.NoError(t, err)
	assert.Nil(t, plain.Detector, "the package's Run is unwired")
	assert.Equal(t, res[0].GoodputPerHour, plain.GoodputPerHour, "an observer does not change the run")
}
