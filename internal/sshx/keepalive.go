package sshx

import (
	"context"
	"fmt"
	"time"

	"golang.org/x/crypto/ssh"
)

// Keepalive asks the server every interval whether c is alive (OpenSSH's
// keepalive@openssh.com, as ssh's ServerAliveInterval does; any answer
// will do, and OpenSSH's refusal of a request it does not know is one)
// until ctx ends, then returns nil. A request that fails, or missed
// intervals in a row without an answer, end it with an error saying
// which: the connection is then as good as gone, and the caller closes it.
// While paused (nil: never) says the server is paused on purpose (a
// hibernated guest), nothing is sent and no interval counts as missed.
func Keepalive(ctx context.Context, c *ssh.Client, every time.Duration, missed int, paused func() bool) error {
	t := time.NewTicker(every)
	defer t.Stop()
	unanswered := 0
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if paused != nil && paused() {
			unanswered = 0
			continue
		}
		answered := make(chan error, 1)
		go func() {
			_, _, err := c.SendRequest("keepalive@openssh.com", true, nil)
			answered <- err
		}()
		select {
		case <-ctx.Done():
			return nil
		case err := <-answered:
			if err != nil {
				return fmt.Errorf("a keepalive failed: %w", err)
			}
			unanswered = 0
		case <-time.After(every):
			if paused != nil && paused() {
				continue
			}
			if unanswered++; unanswered >= missed {
				return fmt.Errorf("%d keepalives in a row were left unanswered", unanswered)
			}
		}
	}
}
