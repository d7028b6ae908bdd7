package hold

import (
	"sync"

	"golang.org/x/crypto/ssh"
)

// NoticesChannel is the channel type a caller opens on the holder to hear what
// the holder's reverse forwards tell the user (a URL the guest asked to open), a
// line each, while it keeps the channel open: an attached terminal shows them.
// The holder accepts it itself (it is not proxied to the guest); the guest's sshd
// refuses it, so a caller connected directly to the guest hears nothing.
const NoticesChannel = "notices@agent-vm"

// Notices passes lines to the callers listening (NoticesChannel).
type Notices struct {
	mu        sync.Mutex
	listeners map[ssh.Channel]bool
}

// NewNotices makes a Notices with nobody listening.
func NewNotices() *Notices { return &Notices{listeners: map[ssh.Channel]bool{}} }

// Send writes line to every listener; one that cannot take it is dropped.
func (n *Notices) Send(line string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for ch := range n.listeners {
		if _, err := ch.Write([]byte(line + "\n")); err != nil {
			ch.Close()
			delete(n.listeners, ch)
		}
	}
}

// listen accepts a caller's notices channel and keeps it until the
// caller closes it.
func (n *Notices) listen(nc ssh.NewChannel) {
	ch, reqs, err := nc.Accept()
	if err != nil {
		return
	}
	go ssh.DiscardRequests(reqs)
	n.mu.Lock()
	n.listeners[ch] = true
	n.mu.Unlock()
	// The caller sends nothing; its EOF or close ends the listening.
	buf := make([]byte, 64)
	for {
		if _, err := ch.Read(buf); err != nil {
			break
		}
	}
	n.mu.Lock()
	delete(n.listeners, ch)
	n.mu.Unlock()
	ch.Close()
}
