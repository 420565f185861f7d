package admission

// less orders the queue: smaller priority first, then earlier arrival at the gateway.
func less(a, b *session) bool {
	if !a.priority.Equal(b.priority) {
		return a.priority.Before(b.priority)
	}
	return a.seq < b.seq
}

// Less, SetIndex and Index make a session an indexheap element: the queue is an
// indexheap.Heap, so a cancelled or shed session leaves it in O(log n).
func (s *session) Less(o *session) bool { return less(s, o) }

// SetIndex implements indexheap.Elem.
func (s *session) SetIndex(i int) { s.heapIndex = i }

// Index implements indexheap.Elem.
func (s *session) Index() int { return s.heapIndex }
