package mcpproxy

import (
	"bytes"
	"encoding/json"
	"errors"
)

// Routing: every line a server writes goes to exactly one client stream.
// Responses go to the request that asked; requests and notifications from
// the server go where the client will see them (see routeLocked).

// settleCancelled answers a request the client cancelled, as if the server
// had (the client ignores the answer; it only ends the request's stream).
func (s *session) settleCancelled(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.pending[id]
	if !ok || s.closed {
		return
	}
	if s.kind == legacySSE { // the client stopped listening for it: just forget it
		delete(s.pending, id)
		return
	}
	s.routeResponseLocked(message{
		raw:  rpcError(c.rawID, codeRequestCancelled, "request cancelled by the client"),
		kind: kindResponse, rawID: c.rawID, id: id,
	})
}

func (s *session) rerouteLocked(box *mailbox) {
	items, _ := box.take()
	for _, it := range items {
		if it.response {
			continue
		}
		if m, err := parseMessage(it.raw); err == nil {
			s.routeLocked(m)
		}
	}
}

// fromChild handles one line the server wrote on stdout.
func (s *session) fromChild(line []byte) {
	if bytes.ContainsAny(line, "\r\n") { // JSON whitespace that SSE data must not carry
		var buf bytes.Buffer
		if json.Compact(&buf, line) == nil {
			line = buf.Bytes()
		}
	}
	var msgs []message
	var err error
	if line[0] == '[' { // a batch, from a server of the 2025-03-26 era
		msgs, _, err = parseBody(line)
	} else {
		var m message
		m, err = parseMessage(line)
		msgs = []message{m}
	}
	if err != nil {
		s.log.Warn("ignoring output from the server that is not JSON-RPC", "error", err, "output", preview(line))
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	for _, m := range msgs {
		if m.kind == kindResponse {
			s.routeResponseLocked(m)
		} else {
			s.routeLocked(m)
		}
	}
}

func (s *session) routeResponseLocked(m message) {
	c, ok := s.pending[m.id]
	if ok {
		delete(s.pending, m.id)
	}
	it := item{raw: m.raw, response: true}
	switch s.kind {
	case legacySSE:
		s.putGeneralLocked(it)
		return
	case modernHTTP:
		if ok {
			it.raw = modernResult(c.method, it.raw)
		}
	}
	if !ok {
		s.log.Debug("dropping a response no client is waiting for", "id", string(m.rawID))
		return
	}
	c.ex.remaining--
	if c.ex.remaining == 0 {
		delete(s.exchanges, c.ex)
	}
	if err := c.ex.box.put(it); err != nil && !errors.Is(err, errMailboxClosed) {
		s.log.Warn("client is not reading its stream; closing it", "error", err)
		c.ex.box.close()
	}
}

// routeLocked delivers a request or notification from the server. On the
// legacy transport everything travels on the one SSE stream. On Streamable
// HTTP the spec wants messages related to a client request on that
// request's stream and others on the GET stream; stdio carries no such
// relation, so the proxy infers it: a progress notification goes with the
// request that asked for it, anything else with the only request in flight,
// else on the GET stream, else with the newest request in flight. With no
// stream open it waits in the backlog.
func (s *session) routeLocked(m message) {
	it := item{raw: m.raw}
	switch s.kind {
	case legacySSE:
		s.putGeneralLocked(it)
		return
	case modernHTTP:
		s.routeModernLocked(m)
		return
	}
	if ex := s.pickExchangeLocked(m); ex != nil {
		if err := ex.box.put(it); err != nil {
			s.log.Warn("client is not reading its stream; closing it", "error", err)
			ex.box.close()
		}
		return
	}
	if s.general != nil {
		s.putGeneralLocked(it)
		return
	}
	if len(s.backlog) >= backlogMax {
		s.log.Warn("no client stream to deliver server messages on; dropping the oldest", "queued", len(s.backlog))
		s.backlog = s.backlog[1:]
	}
	s.backlog = append(s.backlog, it)
}

func (s *session) pickExchangeLocked(m message) *exchange {
	var only, newest *exchange
	n := 0
	for ex := range s.exchanges {
		if !ex.sseOK {
			continue
		}
		if m.method == "notifications/progress" && m.progress != "" && ex.progress[m.progress] {
			return ex
		}
		n++
		only = ex
		if newest == nil || ex.seq > newest.seq {
			newest = ex
		}
	}
	switch {
	case n == 1:
		return only
	case s.general != nil:
		return nil
	default:
		return newest
	}
}

func (s *session) putGeneralLocked(it item) {
	if s.general == nil {
		return
	}
	if err := s.general.put(it); err != nil && !errors.Is(err, errMailboxClosed) {
		s.log.Warn("client is not reading its stream; closing it", "error", err)
		s.general.close()
		s.general = nil
	}
}

func (s *session) flushBacklogLocked() {
	backlog := s.backlog
	s.backlog = nil
	for _, it := range backlog {
		if m, err := parseMessage(it.raw); err == nil {
			s.routeLocked(m)
		}
	}
}

func preview(b []byte) string {
	const max = 200
	if len(b) > max {
		return string(b[:max]) + "..."
	}
	return string(b)
}
