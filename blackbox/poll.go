package blackbox

import (
	"context"
	"fmt"
	"time"
)

// Poll is the one wait for a condition, for the tests inside agent-vm
// (internal/testutil's Poll is this one) and for the black-box code
// outside it: it calls cond with backoff (from a millisecond, doubling,
// up to a quarter of a second) until it holds, and returns nil; when ctx
// ends first it returns an error that names what it waited for and why
// ctx ended.
func Poll(ctx context.Context, what string, cond func() bool) error {
	for delay := time.Millisecond; !cond(); delay = min(2*delay, 250*time.Millisecond) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, context.Cause(ctx))
		case <-time.After(delay):
		}
	}
	return nil
}
