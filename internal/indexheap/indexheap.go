// Package indexheap is container/heap for elements that know their place: each element records
// its index, so a queued element can be removed in O(log n) when it is cancelled, shed or killed.
// The simulator's engine queues and the gateway's admission queue both need exactly that.
package indexheap

import "container/heap"

// Elem is what a Heap holds: usually a pointer that orders itself and stores its index.
type Elem[T any] interface {
	// Less orders the heap: the least element is at the top.
	Less(other T) bool
	// SetIndex records the element's position; -1 when it leaves the heap.
	SetIndex(i int)
	// Index returns what SetIndex recorded.
	Index() int
}

// Heap is a min-heap. The zero value is an empty heap.
type Heap[T Elem[T]] struct{ a adapter[T] }

// Len returns the number of elements.
func (h *Heap[T]) Len() int { return len(h.a) }

// Push adds x.
func (h *Heap[T]) Push(x T) { heap.Push(&h.a, x) }

// Peek returns the least element; the heap must not be empty.
func (h *Heap[T]) Peek() T { return h.a[0] }

// Pop removes and returns the least element; the heap must not be empty.
func (h *Heap[T]) Pop() T { return heap.Pop(&h.a).(T) }

// Remove takes x out of the heap; x must be in it.
func (h *Heap[T]) Remove(x T) { heap.Remove(&h.a, x.Index()) }

// Fix restores the heap after x's order changed; x must be in it.
func (h *Heap[T]) Fix(x T) { heap.Fix(&h.a, x.Index()) }

// Items returns the elements in heap order (not sorted). The slice is the heap's own: read it,
// do not keep or change it.
func (h *Heap[T]) Items() []T { return h.a }

// adapter implements heap.Interface.
type adapter[T Elem[T]] []T

func (a adapter[T]) Len() int           { return len(a) }
func (a adapter[T]) Less(i, j int) bool { return a[i].Less(a[j]) }

func (a adapter[T]) Swap(i, j int) {
	a[i], a[j] = a[j], a[i]
	a[i].SetIndex(i)
	a[j].SetIndex(j)
}

func (a *adapter[T]) Push(x any) {
	e := x.(T)
	e.SetIndex(len(*a))
	*a = append(*a, e)
}

func (a *adapter[T]) Pop() any {
	old := *a
	n := len(old) - 1
	e := old[n]
	var zero T
	old[n] = zero
	*a = old[:n]
	e.SetIndex(-1)
	return e
}
