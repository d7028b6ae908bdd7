package mcpproxy

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// A session is one client's conversation with one stdio server process: the
// proxy starts a child per session, because a stdio server serves one client.

type transport int

const (
	streamableHTTP transport = iota + 1 // MCP Streamable HTTP (2025-03-26 and later)
	legacySSE                           // HTTP+SSE (2024-11-05)
	modernHTTP                          // Streamable HTTP of 2026-07-28: a pooled server the proxy initialized (pool.go)
)

// backlogMax bounds the server-to-client messages held for a Streamable HTTP
// client that has no stream open to receive them.
const backlogMax = 256

var (
	errSessionGone   = errors.New("session ended")
	errStreamExists  = errors.New("a stream is already open for this session")
	errDuplicateID   = errors.New("duplicate request id")
	errServerStalled = errors.New("the MCP server is not reading its input")
)

// call is a client request waiting for the server's response.
type call struct {
	rawID  json.RawMessage
	method string
	ex     *exchange // the POST waiting for it; nil on the legacy transport
}

// exchange is one Streamable HTTP POST waiting for the responses to its
// requests, and the stream server messages related to them can travel on.
type exchange struct {
	box       *mailbox
	sseOK     bool // the client accepts text/event-stream on this POST
	remaining int  // responses still to come (guarded by session.mu)
	seq       uint64
	progress  map[string]bool // progress tokens its requests asked for
}

type session struct {
	id     string
	kind   transport
	server *serverEntry
	proxy  *Proxy
	log    hclog.Logger
	child  *child
	stop   chan struct{} // closed by end(): the run goroutine stops the child

	mu        sync.Mutex
	closed    bool
	reason    string // why it ended, once closed
	pending   map[string]*call
	exchanges map[*exchange]struct{}
	general   *mailbox // GET stream (Streamable HTTP) or the SSE stream (legacy)
	backlog   []item
	seq       uint64
	active    int       // HTTP requests in progress on this session
	lastUsed  time.Time // when active last dropped to zero

	// modernHTTP only, set once when it starts: the pool it belongs to and
	// the server's answer to the proxy's initialize.
	key        poolKey
	initResult json.RawMessage
}

func newSessionID() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("crypto/rand failed: %v", err)) // never on Linux >= 3.17
	}
	return hex.EncodeToString(b)
}

// run waits for the child to go (or for end), ends the session, and stops
// the child. It is the session's only long-lived goroutine.
func (s *session) run() {
	defer s.proxy.wg.Done()
	c := s.child
	select {
	case <-s.stop:
	case <-c.exited:
		waitUpTo(c.outDone, drainTimeout) // its last responses may still be in the pipe
		s.end(s.childGoneMessage())
	case <-c.outDone:
		waitUpTo(c.exited, drainTimeout) // usually it is exiting: wait to say how
		s.end(s.childGoneMessage())
	}
	c.stop(s.proxy.opts.StopGrace)
	s.log.Debug("server stopped", "status", c.exitStatus())
}

func waitUpTo(ch <-chan struct{}, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	}
}

func (s *session) childGoneMessage() string {
	c := s.child
	if err := c.stdoutErr(); errors.Is(err, errMessageTooLarge) {
		s.log.Error("ending session", "error", err)
		return fmt.Sprintf("MCP server %q sent a message larger than %d bytes; the session is over (start a new one)", s.server.Name, s.proxy.opts.MaxMessageBytes)
	}
	status := c.exitStatus()
	s.log.Warn("server exited; ending its session", "status", status)
	return fmt.Sprintf("MCP server %q %s before answering; the session is over (start a new one; the server's stderr is in the agent-mcp log)", s.server.Name, status)
}

// end ends the session once: every request still waiting gets a JSON-RPC
// error carrying msg, streams close, the session leaves the proxy's table,
// and the run goroutine stops the child.
func (s *session) end(msg string) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	s.reason = msg
	for _, c := range s.pending {
		it := item{raw: rpcError(c.rawID, codeConnectionClosed, msg), response: true}
		switch {
		case c.ex != nil:
			_ = c.ex.box.put(it)
		case s.general != nil:
			_ = s.general.put(it)
		}
	}
	s.pending = nil
	for ex := range s.exchanges {
		ex.box.close()
	}
	s.exchanges = nil
	if s.general != nil {
		s.general.close()
		s.general = nil
	}
	s.backlog = nil
	s.mu.Unlock()
	s.proxy.forget(s)
	s.log.Info("session ended", "reason", msg)
	close(s.stop)
}

// begin and finish bracket every HTTP request on the session, for idle expiry.
func (s *session) begin() {
	s.mu.Lock()
	s.active++
	s.mu.Unlock()
}

func (s *session) finish() {
	s.mu.Lock()
	s.active--
	s.lastUsed = s.proxy.now()
	s.mu.Unlock()
}

// idleSince reports when the session became idle, or false if it is in use.
func (s *session) idleSince() (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastUsed, s.active == 0 && !s.closed
}

// send queues client messages for the server, in order. A cancellation
// also settles the cancelled request here: the server need not answer it
// (the spec says it should not), so its HTTP stream would otherwise wait
// until the session ends.
func (s *session) send(msgs []message) error {
	for _, m := range msgs {
		switch err := s.child.send(m.raw); {
		case errors.Is(err, errMailboxFull):
			return errServerStalled
		case err != nil:
			return errSessionGone
		}
		if m.cancels != "" {
			s.settleCancelled(m.cancels)
		}
	}
	return nil
}

// register records the requests of a Streamable HTTP POST as pending and
// returns the exchange their responses will arrive on.
func (s *session) register(reqs []message, sseOK bool) (*exchange, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, s.goneLocked()
	}
	if err := s.checkNewIDsLocked(reqs); err != nil {
		return nil, err
	}
	s.seq++
	ex := &exchange{
		box:       newMailbox(s.proxy.queueLimit()),
		sseOK:     sseOK,
		remaining: len(reqs),
		seq:       s.seq,
		progress:  map[string]bool{},
	}
	for _, r := range reqs {
		s.pending[r.id] = &call{rawID: r.rawID, method: r.method, ex: ex}
		if r.progress != "" {
			ex.progress[r.progress] = true
		}
	}
	s.exchanges[ex] = struct{}{}
	if sseOK {
		s.flushBacklogLocked()
	}
	return ex, nil
}

// registerLegacy records requests sent on the legacy transport, whose
// responses travel on the session's one SSE stream.
func (s *session) registerLegacy(reqs []message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return s.goneLocked()
	}
	if err := s.checkNewIDsLocked(reqs); err != nil {
		return err
	}
	for _, r := range reqs {
		s.pending[r.id] = &call{rawID: r.rawID}
	}
	return nil
}

func (s *session) checkNewIDsLocked(reqs []message) error {
	for _, r := range reqs {
		if _, dup := s.pending[r.id]; dup {
			return fmt.Errorf("%w: request id %s is already waiting for a response in this session", errDuplicateID, r.rawID)
		}
	}
	return nil
}

// abandon drops an exchange whose client went away before all responses
// came: their responses will be dropped, and server requests or
// notifications queued for it are routed elsewhere rather than lost.
func (s *session) abandon(ex *exchange) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.exchanges[ex]; !ok && s.closed {
		return
	}
	for id, c := range s.pending {
		if c.ex == ex {
			delete(s.pending, id)
		}
	}
	delete(s.exchanges, ex)
	ex.box.close()
	s.rerouteLocked(ex.box)
}

// openGeneral opens the session's server-to-client stream (a Streamable
// HTTP GET). Messages that waited for a stream are delivered on it first.
func (s *session) openGeneral() (*mailbox, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, s.goneLocked()
	}
	if s.general != nil {
		return nil, errStreamExists
	}
	s.general = newMailbox(s.proxy.queueLimit())
	s.flushBacklogLocked()
	return s.general, nil
}

// closeGeneral is called when the client's GET stream ends.
func (s *session) closeGeneral(box *mailbox) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.general == box {
		s.general = nil
	}
	box.close()
	if !s.closed {
		s.rerouteLocked(box)
	}
}

// generalBox returns the session's general stream, if one is open.
func (s *session) generalBox() *mailbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.general
}

func (s *session) goneLocked() error { return fmt.Errorf("%w: %s", errSessionGone, s.reason) }
