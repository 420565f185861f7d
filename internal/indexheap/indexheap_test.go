package indexheap

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type item struct{ v, idx int }

func (a *item) Less(b *item) bool { return a.v < b.v }
func (a *item) SetIndex(i int)    { a.idx = i }
func (a *item) Index() int        { return a.idx }

func TestHeapOrdersAndRemoves(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var h Heap[*item]
	var all []*item
	for range 500 {
		it := &item{v: rng.IntN(1000)}
		h.Push(it)
		all = append(all, it)
	}
	for _, it := range all[:100] { // remove a fifth from the middle of the heap
		h.Remove(it)
		assert.Equal(t, -1, it.idx)
	}
	for i, it := range h.Items() {
		require.Equal(t, i, it.idx, "every element knows its place")
	}
	want := make([]int, 0, 400)
	for _, it := range all[100:] {
		want = append(want, it.v)
	}
	slices.Sort(want)
	var got []int
	for h.Len() > 0 {
		assert.Equal(t, h.Peek(), h.Items()[0])
		got = append(got, h.Pop().v)
	}
	assert.Equal(t, want, got)
}
