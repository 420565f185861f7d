package gateway

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/basin-dev/basin/internal/agentcall"
	"github.com/basin-dev/basin/internal/secret"
)

// endpoint is the API shape a model call came through.
type endpoint = agentcall.Shape

const (
	chatEndpoint       = agentcall.Chat
	completionEndpoint = agentcall.Completions
)

// tokensOf is the token estimate of chars characters (agentcall.Tokens).
func tokensOf(chars int64) int64 { return agentcall.Tokens(chars) }

// parseCall reads a model call's body. Reading is lenient: the gateway proxies a body it cannot
// make sense of all the same (the upstream judges it), sized by its length, so the problem
// agentcall.Read reports is not the gateway's to answer. An ambiguous body (a key read twice,
// see agentcall) is read as one with no session identity.
func parseCall(ep endpoint, body []byte) agentcall.Call {
	c, _ := agentcall.Read(ep, body)
	return c
}

// MaxSessionIDBytes bounds a session id. Ids are kept per live session, in the state file and
// the journal, and logged; agents' ids are UUIDs or short hashes, so anything longer is a client
// putting something else in the header (a prompt, a token), refused with 400 naming where it came
// from.
const MaxSessionIDBytes = 256

// sessionID is the call's session identity: the first non-empty of the configured headers, then
// the body's metadata.session_id, then prompt_cache_key, then user (Anthropic's metadata.user_id);
// "" when it has none (a Responses chain is looked up after, by chain).
func (g *Gateway) sessionID(h http.Header, c agentcall.Call) string {
	id, _ := g.sessionIDSource(h, c)
	return id
}

// sessionIDSource is sessionID and where it came from: the header's name or the body field's.
func (g *Gateway) sessionIDSource(h http.Header, c agentcall.Call) (id, source string) {
	return c.Identity(h, g.cfg.SessionHeaders)
}

// checkSessionID refuses an id over MaxSessionIDBytes, naming its source.
func checkSessionID(id, source string) error {
	if len(id) > MaxSessionIDBytes {
		return fmt.Errorf("%s: session id is %d bytes, longer than the %d allowed", source, len(id), MaxSessionIDBytes)
	}
	return nil
}

// headerSessionID is the session identity from headers alone (calls whose bodies are not read).
func (g *Gateway) headerSessionID(h http.Header) string {
	var none agentcall.Call
	id, _ := none.Identity(h, g.cfg.SessionHeaders)
	return id
}

// tenant is who a call runs for: the tenant header, else a hash of the API key (never the key
// itself) — the bearer token, or x-api-key, where Anthropic's clients send it — else "".
func (g *Gateway) tenant(h http.Header) string {
	if g.cfg.TenantHeader != "" {
		if v := strings.TrimSpace(h.Get(g.cfg.TenantHeader)); v != "" {
			return v
		}
	}
	if key, ok := secret.Bearer(h.Get("Authorization")); ok && key != "" {
		return APIKeyTenant(key)
	}
	if key := strings.TrimSpace(h.Get("x-api-key")); key != "" {
		return APIKeyTenant(key)
	}
	return ""
}

// APIKeyTenant is the tenant name of calls made with an API key and no tenant header: "key-"
// and the first 16 hex digits of the SHA-256 of the key. Quotas for such tenants use this name.
func APIKeyTenant(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "key-" + hex.EncodeToString(sum[:8])
}

// sessionEnd reads x-session-end: true ends the session when the call finishes.
func sessionEnd(h http.Header) (bool, error) {
	v := strings.TrimSpace(h.Get("x-session-end"))
	if v == "" {
		return false, nil
	}
	return strconv.ParseBool(v)
}

// anonymousID names a one-call session.
func anonymousID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "anon-" + hex.EncodeToString(b[:])
}
