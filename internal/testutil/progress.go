package testutil

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/blackbox"
)

// Stall is how long a test's VM work may show no progress before its
// Context ends.
const Stall = 10 * time.Minute

// Context is the context a test that boots VMs, builds images or runs
// other slow work hands to it: it has no time to finish in (machines of
// one kind differ by 1.5x and more, and CI runs two VMs at once), and ends
// only when nothing has moved for Stall (blackbox.Watch: the machine's
// QEMUs and this test's process group idle, none of consoles growing),
// with the cause saying what the test was doing (what), or when the test
// ends. A hang thus fails the test with a reason before `go test`'s own
// -timeout kills the whole package without one.
func Context(t testing.TB, what string, consoles ...string) context.Context {
	t.Helper()
	w := blackbox.NewWatch(Stall, func() []string { return consoles })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w.Start(ctx)
	t.Cleanup(w.Track(syscall.Getpgrp()))
	wctx, stop := w.Context(ctx, func() string { return what })
	t.Cleanup(stop)
	return wctx
}

// WaitFor polls cond (Poll) until it holds, and fails the test when
// nothing has moved for Stall first (see Context): a VM under TCG on a
// busy machine may take minutes to get where a quiet one gets in seconds.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	if err := Poll(Context(t, what), what, cond); err != nil {
		t.Fatal(err)
	}
}

// Poll is the tests' one wait for a condition (blackbox.Poll, shared
// with the black-box code): cond with backoff until it holds, or an error
// naming what it waited for once ctx ends. A test that waits on a process
// of its own gives ctx a deadline; one that waits on a VM uses WaitFor.
var Poll = blackbox.Poll
