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
// been passed on (so an exit-status and the last output arrive before the
// caller's channel closes). Data and requests travel on separate paths,
// because x/crypto/ssh hands them over separately: their order relative to
// each other is not kept (a window-change sent just before a keystroke may
// reach the guest just after it), while data keeps its order and the
// requests keep theirs.
func relay(c ssh.Channel, creqs <-chan *ssh.Request, g ssh.Channel, greqs <-chan *ssh.Request) {
	toCaller := pump(c, g)
	toGuest := pump(g, c)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		forward(c, greqs) // until the guest closes its channel
		<-toCaller
		c.Close()
	}()
	go func() {
		defer wg.Done()
		forward(g, creqs) // until the caller closes its channel
		<-toGuest
		g.Close()
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
// reply, until reqs is closed (its channel closed).
func forward(dst ssh.Channel, reqs <-chan *ssh.Request) {
	for r := range reqs {
		ok, err := dst.SendRequest(r.Type, r.WantReply, r.Payload)
		if r.WantReply {
			_ = r.Reply(ok && err == nil, nil)
		}
	}
}
