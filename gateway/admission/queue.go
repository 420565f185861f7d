package admission

// less orders the queue: fresh sessions before stale ones (Options.StaleAfter), then smaller key
// first, then the tie order. The key is the fixed priority p = arrival + peak/r for a fresh
// session and peak/r − arrival for a stale one (newest first); keyLocked sets both.
func less(a, b *session) bool {
	if a.stale != b.stale {
		return !a.stale
	}
	if a.key != b.key {
		return a.key < b.key
	}
	return a.tie < b.tie
}

// Less, SetIndex and Index make a session an indexheap element: the queue is an
// indexheap.Heap, so a cancelled or shed session leaves it in O(log n).
func (s *session) Less(o *session) bool { return less(s, o) }

// SetIndex implements indexheap.Elem.
func (s *session) SetIndex(i int) { s.heapIndex = i }

// Index implements indexheap.Elem.
func (s *session) Index() int { return s.heapIndex }
