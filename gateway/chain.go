package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"

	"github.com/basin-dev/basin/gateway/replication"
)

// A Responses conversation may be carried by the server: each call names the previous response
// (previous_response_id) instead of re-sending the history, so its body holds only the new
// input. Such a chain is one agent session. When the call names no session itself (no session
// header, metadata.session_id, prompt_cache_key or user), the gateway keys the session by the
// chain: the first call of a chain starts a session of its own, each response id it answers with
// is remembered for as long as the session lives, and a call continuing one of them joins that
// session with its context — the chain's, not the few tokens of the new input.

// chainLink is a response a later call may continue.
type chainLink struct {
	session string
	// context is the session's context in tokens once this response was written (its prompt,
	// the whole chain, plus its output).
	context int64
}

// chainPrefix marks the session ids the gateway gives to chains.
const chainPrefix = "chain-"

// chain reads a Responses call's place in a chain: the session it belongs to when it names none
// itself, and its prompt estimate grown by the context of the response it continues. A call the
// server does not keep (store: false) ends no chain a later call could continue; one continuing
// a response the gateway does not know (kept before a restart, or by another replica) is keyed
// by that response id, so the rest of its chain still stays together. Replicated, a response
// another replica answered is looked up at the admission leader, which every replica tells of
// the responses it answers (see package replication).
func (g *Gateway) chain(ctx context.Context, c *call) {
	prev := c.req.PreviousResponseID
	var link chainLink
	known := false
	if prev != "" {
		g.mu.Lock()
		link, known = g.mu.chains[prev]
		g.mu.Unlock()
		if !known && c.id == "" {
			link.session, link.context, known = g.repl.LookupChain(ctx, prev)
		}
	}
	if known {
		c.req.Prompt += link.context
	}
	if c.id != "" {
		c.chained = !c.req.NoStore
		return
	}
	switch {
	case known:
		c.id = link.session
	case prev != "":
		c.id = chainPrefix + prev
	case c.req.NoStore, g.cfg.RejectAnonymous:
		// A one-call session; or, with reject_anonymous, a call that names no session and
		// continues none, refused like any other.
	default:
		var b [8]byte
		_, _ = rand.Read(b[:])
		c.id = chainPrefix + hex.EncodeToString(b[:])
	}
	c.chained = c.id != "" && !c.req.NoStore
}

// chained remembers a Responses call's answer, so that a call continuing it joins its session.
// A session that ended meanwhile keeps nothing. An answer remembered already (from its stream's
// first event) takes the context it has once complete.
func (g *Gateway) chained(session, responseID string, context int64) {
	g.mu.Lock()
	si, ok := g.mu.sessions[session]
	if ok {
		g.linkLocked(si, session, responseID, context)
	}
	g.mu.Unlock()
	if ok {
		g.repl.ReportChain(session, responseID, context)
	}
}

// linkLocked records that session si continues as a call naming responseID, with context
// tokens (g.mu held). A response recorded already keeps its one place in si.responses.
func (g *Gateway) linkLocked(si *sessionInfo, session, responseID string, context int64) {
	if l, seen := g.mu.chains[responseID]; !seen || l.session != session {
		si.responses = append(si.responses, responseID)
	}
	g.mu.chains[responseID] = chainLink{session: session, context: context}
}

// linkChain records, on the leader, a response a replica answered for a live session. A
// session that is not live (ended meanwhile) keeps nothing, as on the replica itself.
func (g *Gateway) linkChain(session, responseID string, context int64) {
	if session == "" || responseID == "" {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.core.Live(session) {
		return
	}
	if l, ok := g.mu.chains[responseID]; ok && l.session == session {
		context = max(l.context, context) // told again (a new leader's resync)
	}
	si, ok := g.mu.sessions[session]
	if !ok {
		si = &sessionInfo{upstream: g.pickUpstream(session)}
		g.addSessionLocked(session, si)
	}
	g.linkLocked(si, session, responseID, context)
}

// chainLinks are every response a live session here may be continued from: what a new leader
// learns again from its followers.
func (g *Gateway) chainLinks() []replication.ChainLink {
	g.mu.Lock()
	defer g.mu.Unlock()
	var links []replication.ChainLink
	for id, si := range g.mu.sessions {
		for _, resp := range si.responses {
			if l, ok := g.mu.chains[resp]; ok {
				links = append(links, replication.ChainLink{Session: id, Response: resp, Context: l.context})
			}
		}
	}
	return links
}
