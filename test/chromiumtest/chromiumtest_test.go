package chromiumtest

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// dom is serialised the way Chromium's --dump-dom writes it.
const dom = `<html><body data-loaded="true"><div id="dry-run" class="dry-run" hidden=""><strong>dry run</strong>: basin decides</div>
<div id="state" class="state" data-state="blind">blind</div><div id="hidden-ish" data-hidden="x">a</div>
<div id="outer"><div>one &amp; <b>two</b></div>
  <div>three</div></div>
<table id="actions"><thead><tr><th>kind</th><th>reason</th></tr></thead><tbody><tr><td>budget</td><td title="a">B 1M → 950K</td></tr><tr><td>shed</td><td>x &lt; y</td></tr></tbody></table>
</body></html>`

func TestReaders(t *testing.T) {
	for _, tc := range []struct {
		id, text string
		ok       bool
		hidden   bool
	}{
		{"dry-run", "dry run: basin decides", true, true},
		{"state", "blind", true, false},
		{"hidden-ish", "a", true, false},
		{"outer", "one & two three", true, false},
		{"missing", "", false, false},
	} {
		t.Run(tc.id, func(t *testing.T) {
			text, ok := Text(dom, tc.id)
			assert.Equal(t, tc.ok, ok)
			assert.Equal(t, tc.text, text)
			assert.Equal(t, tc.hidden, Hidden(dom, tc.id))
		})
	}
	assert.Equal(t, "blind", Attr(dom, "state", "data-state"))
	assert.Empty(t, Attr(dom, "state", "title"))
	assert.Equal(t, [][]string{{"budget", "B 1M → 950K"}, {"shed", "x < y"}}, Rows(dom, "actions"), "header cells are not a row")
	assert.Nil(t, Rows(dom, "missing"))
}
