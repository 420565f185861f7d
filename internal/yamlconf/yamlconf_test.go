package yamlconf

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type conf struct {
	Name  string   `yaml:"name"`
	Wait  Duration `yaml:"wait"`
	Inner struct {
		Count int `yaml:"count"`
	} `yaml:"inner"`
	List []int `yaml:"list"`
}

func TestDecodeNamesKeyAndLine(t *testing.T) {
	cases := []struct{ yaml, want string }{
		{"name: x\nwiat: 3s\n", `line 2: unknown key "wiat"`},
		{"name: x\ninner:\n  count: many\n", "line 3: inner.count:"},
		{"wait: soon\n", `line 1: wait: duration "soon"`},
		{"wait: -3s\n", "must not be negative"},
		{"list: [1, x]\n", "line 1: list"},
		{"name: [\n", "line"},
	}
	for _, tc := range cases {
		t.Run(tc.want, func(t *testing.T) {
			var c conf
			_, err := Decode([]byte(tc.yaml), &c)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestDecodeAndLineOf(t *testing.T) {
	var c conf
	root, err := Decode([]byte("name: x\nwait: 1m30s\ninner:\n  count: 3\nlist: [1, 2]\n"), &c)
	require.NoError(t, err)
	assert.Equal(t, 90*time.Second, time.Duration(c.Wait))
	assert.Equal(t, "1m30s", c.Wait.String())
	assert.Equal(t, 4, LineOf(root, "inner", "count"))
	assert.Equal(t, 5, LineOf(root, "list", "1"))
	assert.Zero(t, LineOf(root, "absent"))

	_, err = Decode(nil, &c)
	assert.NoError(t, err, "an empty file decodes to nothing")

	over := conf{Name: "preset"}
	over.Inner.Count = 7
	require.NoError(t, Overlay([]byte("name: mine\n"), &over))
	assert.Equal(t, "mine", over.Name)
	assert.Equal(t, 7, over.Inner.Count, "keys the file omits keep their value")
}

func TestKeys(t *testing.T) {
	type inner struct {
		B int `yaml:"b"`
	}
	type item struct {
		N string `yaml:"name"`
	}
	type embedded struct {
		E int `yaml:"e"`
	}
	type cfg struct {
		A        int    `yaml:"a"`
		In       inner  `yaml:"inner"`
		Items    []item `yaml:"items"`
		Skip     int    `yaml:"-"`
		embedded `yaml:",inline"`
		//lint:ignore U1000 the walk must pass over an unexported field
		private int
		Plain   bool
	}
	assert.Equal(t, []string{"a", "inner", "inner.b", "items", "items[].name", "e", "plain"}, Keys(cfg{}))
	assert.Equal(t, Keys(cfg{}), Keys((*cfg)(nil)), "a nil pointer names the same keys")

	// Walk hands each key's value, except inside list elements.
	vals := map[string]any{}
	Walk(&cfg{A: 1, In: inner{B: 2}, Items: []item{{N: "x"}}, embedded: embedded{E: 3}, Plain: true}, func(f Field) {
		if f.Value.IsValid() {
			vals[f.Key] = f.Value.Interface()
		} else {
			vals[f.Key] = nil
		}
	})
	assert.Equal(t, map[string]any{"a": 1, "inner": inner{B: 2}, "inner.b": 2, "items": []item{{N: "x"}},
		"items[].name": nil, "e": 3, "plain": true}, vals)
}

// TestDurationsReadOneWay: a time.Duration field reads "30s" like a Duration field does, and a bare
// number — which yaml.v3 would take as nanoseconds — is refused with its key and line.
func TestDurationsReadOneWay(t *testing.T) {
	type inner struct {
		Every time.Duration `yaml:"every"`
	}
	type conf struct {
		Wait  time.Duration            `yaml:"wait"`
		Inner inner                    `yaml:"inner"`
		List  []inner                  `yaml:"list"`
		ByKey map[string]time.Duration `yaml:"by_key"`
		Ptr   *inner                   `yaml:"ptr"`
	}
	for _, tc := range []struct {
		name, doc, wantErr string
	}{
		{"strings", "wait: 30s\ninner: {every: 2m}\nlist: [{every: 1h}]\nby_key: {a: 5s}\nptr: {every: 1s}\n", ""},
		{"unset and null", "wait:\ninner: {}\n", ""},
		{"number at the top", "wait: 120\n", "line 1: wait: duration 120: want a value like 30s or 10m"},
		{"number nested", "inner:\n  every: 5\n", "line 2: inner.every: duration 5"},
		{"number in a list", "list:\n  - every: 1m\n  - every: 7\n", "line 3: list[1].every: duration 7"},
		{"number in a map", "by_key: {a: 3}\n", "by_key.a: duration 3"},
		{"number behind a pointer", "ptr: {every: 9}\n", "ptr.every: duration 9"},
		{"not a duration", "wait: soon\n", "line 1: wait: duration soon"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c conf
			_, err := Decode([]byte(tc.doc), &c)
			if tc.wantErr == "" {
				require.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tc.wantErr)
		})
	}
	var c conf
	_, err := Decode([]byte("wait: 30s\ninner: {every: 2m}\n"), &c)
	require.NoError(t, err)
	assert.Equal(t, 30*time.Second, c.Wait)
	assert.Equal(t, 2*time.Minute, c.Inner.Every)
}

// TestDecodeReportsEveryBadValue: a file with several bad values names each, with its key and
// line — a bad duration used to stop the decoding and hide every mistake after it.
func TestDecodeReportsEveryBadValue(t *testing.T) {
	type withStd struct {
		conf `yaml:",inline"`
		Std  time.Duration `yaml:"std"`
	}
	var c withStd
	root, err := Decode([]byte("wait: soon\nname: x\ninner:\n  count: many\nstd: 12\nlist: [1, x]\nwiat: 3s\n"), &c)
	require.Error(t, err)
	require.NotNil(t, root, "the document parsed: the caller can validate the rest")
	for _, want := range []string{`line 1: wait: duration "soon"`, "line 4: inner.count:", "line 5: std: duration 12",
		"line 6: list", `line 7: unknown key "wiat"`} {
		assert.Contains(t, err.Error(), want)
	}
	assert.Equal(t, 1, strings.Count(err.Error(), "line 5:"), "one message a line: %v", err)
	assert.Equal(t, "x", c.Name, "what decoded is there")
}

// TestJoinLeavesOutTheSameLine: validating what decoded reports more mistakes, but none about a
// key the decoding already refused.
func TestJoinLeavesOutTheSameLine(t *testing.T) {
	err := Join(errors.New("line 2: interval: duration \"fast\": want a value like 30s or 10m"),
		errors.Join(errors.New("line 2: interval: 0s, must be at least 1s"), errors.New("line 5: lending.max_fraction: 2 outside [0, 1]")))
	assert.Contains(t, err.Error(), "line 5: lending.max_fraction")
	assert.NotContains(t, err.Error(), "must be at least 1s")
	assert.Contains(t, err.Error(), `duration "fast"`)
}
