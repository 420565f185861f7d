package predictor_test

import (
	"hash/fnv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/gateway/predictor"
)

func TestExtract(t *testing.T) {
	tests := []struct {
		name      string
		text      string
		chars     int
		same      string // a text that must give the same terms
		terms     int    // distinct words
		wantChars int
	}{
		{name: "empty", text: "", terms: 0, wantChars: 0},
		{name: "punctuation only", text: " -- !? ", chars: 7, terms: 0, wantChars: 7},
		{name: "case and separators do not matter", text: "Fix the PARSER!", same: "fix-the parser", terms: 3, wantChars: 15},
		{name: "word order does not matter", text: "fix parser", same: "parser fix", terms: 2, wantChars: 10},
		{name: "repeats are counted, not added", text: "go go go", same: "GO, go; go", terms: 1, wantChars: 8},
		{name: "digits are word characters", text: "py3 tests", same: "PY3  tests", terms: 2, wantChars: 9},
		{name: "letters beyond ASCII", text: "Änderung prüfen", same: "änderung PRÜFEN", terms: 2, wantChars: 15},
		{name: "stated length wins", text: "abc", chars: 500, terms: 1, wantChars: 500},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := predictor.Extract(tt.text, tt.chars, 1000)
			assert.Len(t, f.Terms, tt.terms)
			assert.Equal(t, tt.wantChars, f.TaskChars)
			assert.Equal(t, 1000, f.FirstPrompt)
			if tt.same != "" {
				assert.Equal(t, f.Terms, predictor.Extract(tt.same, 0, 0).Terms)
			}
		})
	}
	t.Run("different words differ", func(t *testing.T) {
		assert.NotEqual(t, predictor.Extract("fix parser", 0, 0).Terms, predictor.Extract("fix lexer", 0, 0).Terms)
	})
	t.Run("negative lengths count as zero", func(t *testing.T) {
		f := predictor.Extract("", -5, -7)
		assert.Equal(t, 0, f.TaskChars)
		assert.Equal(t, 0, f.FirstPrompt)
	})
}

// TestExtractHashIsFNV1a pins the hashing of model version 1: saved weights are indexed by these
// hashes, so a change here would silently scramble every model file.
func TestExtractHashIsFNV1a(t *testing.T) {
	f := predictor.Extract("Refactor the Überprüfung; refactor!", 0, 0)
	want := map[uint64]int{}
	for w, n := range map[string]int{"refactor": 2, "the": 1, "überprüfung": 1} {
		h := fnv.New64a()
		_, _ = h.Write([]byte(w))
		want[h.Sum64()] = n
	}
	got := map[uint64]int{}
	for i, term := range f.Terms {
		if i > 0 {
			require.Less(t, f.Terms[i-1].Hash, term.Hash, "terms in order of hash")
		}
		got[term.Hash] = term.Count
	}
	assert.Equal(t, want, got)
}
