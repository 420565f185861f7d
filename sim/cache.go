package sim

import "time"

// link is what an element of a list carries inside itself (an intrusive list, as the Linux
// kernel's list_head): pushing and removing allocate nothing, which matters because a cached
// prefix leaves and rejoins the LRU at every prefill that uses it. elem points back at the
// element that holds the link.
type link[T any] struct {
	prev, next *link[T]
	elem       *T
}

// list is a doubly linked list of elements that embed a link[T]: least recently pushed at the
// front, so walking from the front visits them oldest first, the order both the prefix cache and
// lent KV are evicted in.
type list[T any] struct {
	head, tail *link[T]
}

// pushBack appends e, whose link is l, at the back (most recently used).
func (ls *list[T]) pushBack(e *T, l *link[T]) {
	l.elem = e
	l.prev, l.next = ls.tail, nil
	if ls.tail != nil {
		ls.tail.next = l
	} else {
		ls.head = l
	}
	ls.tail = l
}

// remove unlinks l, which must be in the list.
func (ls *list[T]) remove(l *link[T]) {
	if l.prev != nil {
		l.prev.next = l.next
	} else {
		ls.head = l.next
	}
	if l.next != nil {
		l.next.prev = l.prev
	} else {
		ls.tail = l.prev
	}
	l.prev, l.next = nil, nil
}

// front is the least recently pushed element; nil when the list is empty.
func (ls *list[T]) front() *T {
	if ls.head == nil {
		return nil
	}
	return ls.head.elem
}

// all calls yield on each element, oldest first, until it returns false; yield may remove the
// element it is given.
func (ls *list[T]) all(yield func(*T) bool) {
	for l := ls.head; l != nil; {
		next := l.next
		if !yield(l.elem) {
			return
		}
		l = next
	}
}

// entry is one session's cached prefix on one prefill instance (GPU or host tier). A radix tree
// keyed by tokens holds, for an agent session, one chain that grows call after call; the entry
// models that chain as a length. Tokens are counted one by one (token granularity, like SGLang's
// default page size of 1); eviction cuts the tail first, as a radix tree evicts leaves first.
type entry struct {
	s        *session
	tokens   int
	refs     int           // in-flight prefills using the prefix; a referenced entry is never evicted
	pinUntil time.Duration // Continuum-style pin; zero when not pinned
	lastUse  time.Duration
	inLRU    bool
	lru      link[entry]
}

// prefixCache is a token-capacity cache with LRU eviction of unreferenced, unpinned prefixes.
// The prefix every session shares (system prompt and tools) is touched by every request, so it is
// kept resident and counted once.
type prefixCache struct {
	capacity  int
	used      int // shared + all entries
	shared    int
	lruTokens int
	pinned    int // entries currently pinned
	lru       list[entry]
}

func (c *prefixCache) free() int { return c.capacity - c.used }

// growShared makes room for a longer shared prefix. It reports false when the cache cannot hold it.
func (c *prefixCache) growShared(n int) {
	if n <= c.shared {
		return
	}
	d := n - c.shared
	if c.free() < d {
		c.evict(d - c.free())
	}
	d = min(d, c.free())
	c.shared += d
	c.used += d
}

func (c *prefixCache) pushLRU(e *entry) {
	e.inLRU = true
	c.lru.pushBack(e, &e.lru)
	c.lruTokens += e.tokens
}

func (c *prefixCache) unlinkLRU(e *entry) {
	if !e.inLRU {
		return
	}
	c.lru.remove(&e.lru)
	e.inLRU = false
	c.lruTokens -= e.tokens
}

// acquire marks e as in use by a prefill: it leaves the LRU so it cannot be evicted.
func (c *prefixCache) acquire(e *entry) {
	c.unlinkLRU(e)
	e.refs++
}

// release ends a use at now. The entry becomes evictable unless still used or pinned.
func (c *prefixCache) release(e *entry, now time.Duration) {
	e.refs--
	e.lastUse = now
	if e.refs == 0 && e.pinUntil == 0 {
		c.pushLRU(e)
	}
}

// pin keeps e resident until until (Continuum's time-to-live). Re-pinning extends the pin.
func (c *prefixCache) pin(e *entry, until time.Duration) {
	if e.pinUntil == 0 {
		c.pinned++
	}
	c.unlinkLRU(e)
	e.pinUntil = until
}

// unpin ends a pin; the entry becomes evictable if nothing references it.
func (c *prefixCache) unpin(e *entry) {
	if e.pinUntil == 0 {
		return
	}
	e.pinUntil = 0
	c.pinned--
	if e.refs == 0 {
		c.pushLRU(e)
	}
}

// setTokens resizes e (growing needs room already made by the caller).
func (c *prefixCache) setTokens(e *entry, n int) {
	d := n - e.tokens
	e.tokens = n
	c.used += d
	if e.inLRU {
		c.lruTokens += d
	}
}

// evict frees at least need tokens from least recently used prefixes, cutting tails; it returns
// how many tokens it freed (less than need when everything else is in use or pinned).
func (c *prefixCache) evict(need int) int {
	freed := 0
	for freed < need && c.lru.head != nil {
		v := c.lru.front()
		cut := min(v.tokens, need-freed)
		v.tokens -= cut
		c.used -= cut
		c.lruTokens -= cut
		freed += cut
		if v.tokens == 0 {
			c.unlinkLRU(v)
		}
	}
	return freed
}

// makeRoom evicts until need tokens are free; it reports whether they are.
func (c *prefixCache) makeRoom(need int) bool {
	if f := c.free(); f < need {
		c.evict(need - f)
	}
	return c.free() >= need
}

// lentEntry is the KV of a session's last call that a decode instance keeps after the call
// finished (KV lending). It is reclaimed, least recently used first, when decode needs memory.
type lentEntry struct {
	s      *session
	d      *decodeInst
	tokens int
	link   link[lentEntry]
}

// lentList is a decode instance's lent KV, oldest first, and its tokens in all.
type lentList struct {
	tokens  int
	entries list[lentEntry]
}

func (l *lentList) push(e *lentEntry) {
	l.entries.pushBack(e, &e.link)
	l.tokens += e.tokens
}

func (l *lentList) remove(e *lentEntry) {
	l.entries.remove(&e.link)
	l.tokens -= e.tokens
}
