package hold

import (
	"errors"
	"io"
	"sync"

	"golang.org/x/crypto/ssh"
)

// opener opens a channel on the guest side (guests.open).
type opener func(kind string, extra []byte) (ssh.Channel, <-chan *ssh.Request, error)

// proxyChannel opens nc's twin on the guest and relays the pair until both
// are closed. A refusal by the guest is passed on with its reason.
func proxyChannel(nc ssh.NewChannel, open opener) {
	g, greqs, err := open(nc.ChannelType(), nc.ExtraData())
	if err != nil {
		var oce *ssh.OpenChannelError
		if errors.As(err, &oce) {
			_ = nc.Reject(oce.Reason, oce.Message)
		} else {
			_ = nc.Reject(ssh.ConnectionFailed, "the held connection to the guest failed: "+err.Error())
		}
		return
	}
	c, creqs, err := nc.Accept()
	if err != nil {
		g.Close()
		return
	}
	relay(c, creqs, g, greqs)
}

// relay joins a caller's channel c and the guest's channel g. Each
// direction copies data and extended data (stderr) and then sends EOF;
// requests go across one at a time, in order, with their replies. When a
// side closes, the other is closed once everything that side sent has
// been passed on: its data, its requests, and its replies to the other
// side's requests. A guest's sshd answers exec and then, for a command
// that ends at once, sends exit-status and closes in the same breath;
// the reply travels on another goroutine than the close, and a close
// passed on first left the caller's exec unanswered (x/crypto/ssh: a bare
// EOF, "the SSH session closed before the command started"). Data and
// requests travel on separate paths, because x/crypto/ssh hands them over
// separately: their order relative to each other is not kept (a
// window-change sent just before a keystroke may reach the guest just
// after it), while data keeps its order and the requests keep theirs.
func relay(c ssh.Channel, creqs <-chan *ssh.Request, g ssh.Channel, greqs <-chan *ssh.Request) {
	toCaller := pump(c, g)
	toGuest := pump(g, c)
	// Each held while a request is on its way and its reply on the way back.
	var callers, guests sync.Mutex
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		forward(c, greqs, &guests) // until the guest closes its channel
		<-toCaller
		callers.Lock() // the guest's reply to a caller's request goes first
		c.Close()
		callers.Unlock()
	}()
	go func() {
		defer wg.Done()
		forward(g, creqs, &callers) // until the caller closes its channel
		<-toGuest
		guests.Lock()
		g.Close()
		guests.Unlock()
	}()
	wg.Wait()
}

// pump copies src's data and extended data to dst, then sends dst EOF.
// The returned channel is closed when both copies are done.
func pump(dst, src ssh.Channel) <-chan struct{} {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _, _ = io.Copy(dst, src) }()
	go func() { defer wg.Done(); _, _ = io.Copy(dst.Stderr(), src.Stderr()) }()
	go func() {
		wg.Wait()
		_ = dst.CloseWrite()
		close(done)
	}()
	return done
}

// forward sends each request of reqs on dst and answers it with dst's
// reply, until reqs is closed (its channel closed), holding inFlight from
// a request's send to its answer.
func forward(dst ssh.Channel, reqs <-chan *ssh.Request, inFlight *sync.Mutex) {
	for r := range reqs {
		inFlight.Lock()
		ok, err := dst.SendRequest(r.Type, r.WantReply, r.Payload)
		beforeReply(r.Type)
		if r.WantReply {
			_ = r.Reply(ok && err == nil, nil)
		}
		inFlight.Unlock()
	}
}

// beforeReply runs between a request's reply from dst and its answer to
// the sender; a test delays the reply to exec with it, the interleaving
// that once lost a quick command's start.
var beforeReply = func(string) {}
