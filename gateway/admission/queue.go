package admission

// less orders the queue: smaller priority first, then earlier arrival at the gateway.
func less(a, b *session) bool {
	if !a.priority.Equal(b.priority) {
		return a.priority.Before(b.priority)
	}
	return a.seq < b.seq
}

// queue is a binary heap of queued sessions with removal by index.
type queue struct{ items []*session }

func (q *queue) Len() int { return len(q.items) }

func (q *queue) swap(i, j int) {
	q.items[i], q.items[j] = q.items[j], q.items[i]
	q.items[i].heapIndex = i
	q.items[j].heapIndex = j
}

func (q *queue) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !less(q.items[i], q.items[p]) {
			return
		}
		q.swap(i, p)
		i = p
	}
}

func (q *queue) down(i int) {
	n := len(q.items)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && less(q.items[r], q.items[l]) {
			m = r
		}
		if !less(q.items[m], q.items[i]) {
			return
		}
		q.swap(i, m)
		i = m
	}
}

func (q *queue) push(s *session) {
	s.heapIndex = len(q.items)
	q.items = append(q.items, s)
	q.up(s.heapIndex)
}

func (q *queue) peek() *session { return q.items[0] }

func (q *queue) pop() *session {
	s := q.items[0]
	q.remove(s)
	return s
}

func (q *queue) remove(s *session) {
	i := s.heapIndex
	n := len(q.items) - 1
	if i != n {
		q.swap(i, n)
	}
	q.items[n] = nil
	q.items = q.items[:n]
	if i != n {
		q.down(i)
		q.up(i)
	}
	s.heapIndex = -1
}
