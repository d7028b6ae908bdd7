package mcpproxy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// The pool of server processes that serve MCP 2026-07-28 clients.
//
// A 2026-07-28 client has no session: each POST carries one request with the
// client's protocol version, identity and capabilities in params._meta. The
// stdio servers behind the proxy speak the initialize-based revisions, so the
// proxy starts a server and performs the handshake itself (revision
// 2025-11-25, the client's clientInfo, no client capabilities: 2026-07-28 has
// no channel for a server's own requests, so the server must not expect to
// sample, elicit or list roots). Starting a server per request would cost a
// process start and a handshake each time, so initialized servers are kept:
//
//   - A request checks out an idle server of its pool, or starts one, and has
//     it to itself until its response arrives. Ids, progress tokens and the
//     notifications a server sends while it works therefore belong to that
//     request alone; concurrent requests get one server each.
//   - A pool is keyed by server name, protocol version and the client's
//     declared clientInfo and capabilities, so a server's in-memory state
//     (log level, subscriptions, whatever the tool keeps) is shared only by
//     requests from the same client program. The proxy accepts exactly one
//     bearer token (one per VM), so every request that gets this far comes
//     from the same principal; nothing is shared across tokens because
//     there is no second token.
//   - A server goes back to its pool once its response is delivered. One
//     whose client went away first is ended instead (closing the stream is
//     the 2026-07-28 cancellation, and its late output must not reach the
//     next request), and so is one that exited or misbehaved.
//   - Pooled servers count against MaxSessions like sessions; at the cap the
//     least recently used idle one is ended to make room. An idle one ends
//     after SessionIdleTimeout, and Shutdown ends them all.

// handshakeTimeout bounds starting a pooled server and its initialize.
const handshakeTimeout = 60 * time.Second

// handshakeVersion is the revision the proxy initializes pooled servers with.
const handshakeVersion = "2025-11-25"

// handshakeID is the id of the proxy's own initialize request.
var handshakeID = json.RawMessage(`"agent-vm-mcp-proxy-initialize"`)

// poolKey identifies the servers one kind of client may share (see above).
type poolKey string

func newPoolKey(server, version string, clientInfo, capabilities json.RawMessage) poolKey {
	h := sha256.New()
	for _, part := range [][]byte{[]byte(server), []byte(version), compactJSON(clientInfo), compactJSON(capabilities)} {
		fmt.Fprintf(h, "%d:%s;", len(part), part)
	}
	return poolKey(hex.EncodeToString(h.Sum(nil)))
}

// checkout returns an initialized server of the pool for key, for one
// request: an idle one, or a new one.
func (p *Proxy) checkout(ctx context.Context, e *serverEntry, key poolKey, clientInfo json.RawMessage) (*session, error) {
	if s := p.takeIdle(key); s != nil {
		return s, nil
	}
	s, err := p.newSession(e, modernHTTP)
	if errors.Is(err, errTooManySessions) && p.evictIdle() {
		s, err = p.newSession(e, modernHTTP)
	}
	if err != nil {
		return nil, err
	}
	s.key = key
	ctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
	defer cancel()
	if err := s.handshake(ctx, clientInfo); err != nil {
		s.end("the proxy's initialize failed")
		// Not wrapped: a server that dies during the proxy's own handshake
		// is a bad gateway (502), not a session the client lost (404,
		// whose hint to send initialize means nothing to a 2026-07-28
		// client). Which of the two the exit looked like was a race.
		return nil, fmt.Errorf("initializing MCP server %q: %v", e.Name, err)
	}
	return s, nil
}

// takeIdle removes the most recently used live server from key's pool.
func (p *Proxy) takeIdle(key poolKey) *session {
	p.mu.Lock()
	defer p.mu.Unlock()
	for list := p.idle[key]; len(list) > 0; list = p.idle[key] {
		s := list[len(list)-1]
		p.setIdleLocked(key, list[:len(list)-1])
		if _, live := s.idleSince(); live {
			return s
		}
	}
	return nil
}

// checkin returns a server to its pool after a request it served completely.
func (p *Proxy) checkin(s *session) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sessions[s.id] != s { // it ended meanwhile
		return
	}
	p.idle[s.key] = append(p.idle[s.key], s)
}

// evictIdle ends the least recently used idle pooled server, to make room
// for a new one. It reports whether there was one.
func (p *Proxy) evictIdle() bool {
	p.mu.Lock()
	var victim *session
	var oldest time.Time
	for _, list := range p.idle {
		for _, s := range list {
			if since, idle := s.idleSince(); idle && (victim == nil || since.Before(oldest)) {
				victim, oldest = s, since
			}
		}
	}
	if victim != nil {
		p.forgetIdleLocked(victim) // so that no request takes it meanwhile
	}
	p.mu.Unlock()
	if victim == nil {
		return false
	}
	victim.end("making room for another client's server (too many sessions)")
	return true
}

// forgetIdleLocked removes an ending server from its pool.
func (p *Proxy) forgetIdleLocked(s *session) {
	list := p.idle[s.key]
	for i, o := range list {
		if o == s {
			p.setIdleLocked(s.key, append(list[:i:i], list[i+1:]...))
			return
		}
	}
}

func (p *Proxy) setIdleLocked(key poolKey, list []*session) {
	if len(list) == 0 {
		delete(p.idle, key)
		return
	}
	p.idle[key] = list
}

// handshake initializes a new pooled server on the client's behalf.
func (s *session) handshake(ctx context.Context, clientInfo json.RawMessage) error {
	if len(clientInfo) == 0 {
		clientInfo = json.RawMessage(`{"name":"agent-vm mcp-proxy","version":"1"}`)
	}
	params, err := json.Marshal(map[string]any{"protocolVersion": handshakeVersion, "capabilities": struct{}{}, "clientInfo": clientInfo})
	if err != nil {
		return fmt.Errorf("encoding initialize: %w", err)
	}
	raw, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": handshakeID, "method": "initialize", "params": json.RawMessage(params)})
	if err != nil {
		return fmt.Errorf("encoding initialize: %w", err)
	}
	var resp struct {
		Result json.RawMessage `json:"result"`
		Error  *struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	answer, err := s.roundTrip(ctx, raw)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(answer, &resp); err != nil {
		return fmt.Errorf("reading the initialize result: %w", err)
	}
	if resp.Error != nil {
		return fmt.Errorf("the server refused initialize: %s (code %d)", resp.Error.Message, resp.Error.Code)
	}
	s.initResult = resp.Result
	return s.send([]message{{raw: []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`), kind: kindNotification, method: "notifications/initialized"}})
}

// roundTrip sends the proxy's own request to the server and returns the
// response.
func (s *session) roundTrip(ctx context.Context, raw []byte) ([]byte, error) {
	m, err := parseMessage(raw)
	if err != nil {
		return nil, err
	}
	ex, err := s.register([]message{m}, false)
	if err != nil {
		return nil, err
	}
	if err := s.send([]message{m}); err != nil {
		s.abandon(ex)
		return nil, err
	}
	for {
		items, closed := ex.box.take()
		for _, it := range items {
			if it.response {
				return it.raw, nil
			}
		}
		if closed {
			return nil, s.gone()
		}
		select {
		case <-ex.box.ready:
		case <-ctx.Done():
			s.abandon(ex)
			return nil, fmt.Errorf("waiting for the answer to %s: %w", m.method, ctx.Err())
		}
	}
}

// gone is why the session ended.
func (s *session) gone() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.goneLocked()
}

// routeModernLocked delivers a server's request or notification on a pooled
// server: a notification goes with the one request it is serving (dropped
// between requests); a request is refused at once, as 2026-07-28 clients
// take none.
func (s *session) routeModernLocked(m message) {
	if m.kind == kindRequest {
		s.log.Warn("refusing a server request: MCP "+modernProtocolVersion+" clients take none", "method", m.method)
		msg := fmt.Sprintf("%s is not available: the client speaks MCP %s through agent-vm's proxy, which has no channel for server requests", m.method, modernProtocolVersion)
		_ = s.child.send(rpcError(m.rawID, codeMethodNotFound, msg))
		return
	}
	if ex := s.pickExchangeLocked(m); ex != nil {
		if err := ex.box.put(item{raw: m.raw}); err != nil {
			s.log.Warn("client is not reading its stream; closing it", "error", err)
			ex.box.close()
		}
		return
	}
	s.log.Debug("dropping a server notification sent between requests", "method", m.method)
}

// compactJSON returns raw without insignificant white space (raw itself if
// it is not valid JSON).
func compactJSON(raw json.RawMessage) []byte {
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		return raw
	}
	return b.Bytes()
}
