package flock

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"
)

// A second Acquire waits (saying so once) until the holder releases; Try
// does not wait; a cancelled wait returns the context's error.
func TestAcquireWaitsTryDoesNot(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x.lock")
	held, err := Acquire(context.Background(), p, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := Try(p, 0o600); ok || err != nil {
		t.Fatalf("Try of a held lock: ok %v, err %v", ok, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := Acquire(ctx, p, 0o600, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire while held, ctx ending: %v", err)
	}
	said := make(chan struct{}, 10)
	got := make(chan *Lock)
	go func() {
		l, err := Acquire(context.Background(), p, 0o600, func() { said <- struct{}{} })
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	<-said // it is waiting
	held.Release()
	l := <-got
	if n := len(said); n != 0 {
		t.Errorf("waiting was called %d more times, want once", n)
	}
	l.Release()
	l.Release() // twice is harmless
	if l2, ok, err := Try(p, 0o600); !ok || err != nil {
		t.Fatalf("Try after release: ok %v, err %v", ok, err)
	} else {
		l2.Release()
	}
}
