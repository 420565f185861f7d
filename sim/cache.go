package sim

import "time"

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
	prev     *entry
	next     *entry
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
	head      *entry
	tail      *entry
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
	e.prev, e.next = c.tail, nil
	if c.tail != nil {
		c.tail.next = e
	} else {
		c.head = e
	}
	c.tail = e
	c.lruTokens += e.tokens
}

func (c *prefixCache) unlinkLRU(e *entry) {
	if !e.inLRU {
		return
	}
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		c.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		c.tail = e.prev
	}
	e.prev, e.next, e.inLRU = nil, nil, false
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
	for freed < need && c.head != nil {
		v := c.head
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
	prev   *lentEntry
	next   *lentEntry
}

type lentList struct {
	tokens int
	head   *lentEntry
	tail   *lentEntry
}

func (l *lentList) push(e *lentEntry) {
	e.prev, e.next = l.tail, nil
	if l.tail != nil {
		l.tail.next = e
	} else {
		l.head = e
	}
	l.tail = e
	l.tokens += e.tokens
}

func (l *lentList) remove(e *lentEntry) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		l.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		l.tail = e.prev
	}
	e.prev, e.next = nil, nil
	l.tokens -= e.tokens
}
