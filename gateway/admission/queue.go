package admission

import "container/heap"

// less orders the queue: smaller priority first, then earlier arrival at the gateway.
func less(a, b *session) bool {
	if !a.priority.Equal(b.priority) {
		return a.priority.Before(b.priority)
	}
	return a.seq < b.seq
}

// queue holds the queued sessions in container/heap's binary heap, each session knowing its index
// so that a cancelled or shed one can be removed in O(log n).
type queue struct{ items []*session }

// Len, Less, Swap, Push and Pop implement heap.Interface; use the methods below.
func (q *queue) Len() int           { return len(q.items) }
func (q *queue) Less(i, j int) bool { return less(q.items[i], q.items[j]) }

func (q *queue) Swap(i, j int) {
	q.items[i], q.items[j] = q.items[j], q.items[i]
	q.items[i].heapIndex = i
	q.items[j].heapIndex = j
}

func (q *queue) Push(x any) {
	s := x.(*session)
	s.heapIndex = len(q.items)
	q.items = append(q.items, s)
}

func (q *queue) Pop() any {
	n := len(q.items) - 1
	s := q.items[n]
	q.items[n] = nil
	q.items = q.items[:n]
	s.heapIndex = -1
	return s
}

func (q *queue) push(s *session)   { heap.Push(q, s) }
func (q *queue) peek() *session    { return q.items[0] }
func (q *queue) pop() *session     { return heap.Pop(q).(*session) }
func (q *queue) remove(s *session) { heap.Remove(q, s.heapIndex) }
