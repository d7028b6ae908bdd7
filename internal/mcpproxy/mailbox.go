package mcpproxy

import (
	"errors"
	"sync"
)

var (
	errMailboxClosed = errors.New("stream closed")
	errMailboxFull   = errors.New("too much data queued for a slow reader")
)

// item is one message queued for a stream.
type item struct {
	raw      []byte
	response bool
}

// mailbox is a queue between one producer that must never block (the child's
// stdout reader) and one consumer (an HTTP handler, or the child's stdin
// writer). It is bounded by bytes so a reader that stops reading cannot make
// the proxy hold unbounded memory: put then fails and the caller ends the
// stream.
type mailbox struct {
	mu     sync.Mutex
	items  []item
	size   int
	limit  int
	closed bool
	ready  chan struct{} // has a token while items or closed are new
}

func newMailbox(limit int) *mailbox {
	return &mailbox{limit: limit, ready: make(chan struct{}, 1)}
}

func (m *mailbox) put(it item) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return errMailboxClosed
	}
	if m.size+len(it.raw) > m.limit && len(m.items) > 0 {
		return errMailboxFull
	}
	m.items = append(m.items, it)
	m.size += len(it.raw)
	m.signal()
	return nil
}

// close stops further puts; items already queued can still be taken.
func (m *mailbox) close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.closed {
		m.closed = true
		m.signal()
	}
}

// take returns everything queued, and whether the mailbox is closed (then no
// more items will ever come once these are handled).
func (m *mailbox) take() ([]item, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	items := m.items
	m.items, m.size = nil, 0
	return items, m.closed
}

func (m *mailbox) signal() {
	select {
	case m.ready <- struct{}{}:
	default:
	}
}
