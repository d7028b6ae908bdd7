// Package flock is agent-vm's one file lock: an exclusive flock(2) on a
// lock file, which the kernel drops when the process dies, so a crashed
// agent-vm never leaves a stale lock behind. The state directory (per-VM,
// ports, creates and removals in progress) and the image cache (one build
// or pull of an image at a time) both lock with it.
package flock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
)

// Lock is a held lock.
type Lock struct{ f *os.File }

// Acquire takes the lock on path (created with perm), waiting with backoff
// until it is free or ctx ends. waiting, when not nil, is called once if it
// has to wait (to say so to the user).
func Acquire(ctx context.Context, path string, perm os.FileMode, waiting func()) (*Lock, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, perm)
	if err != nil {
		return nil, fmt.Errorf("opening lock %s: %w", path, err)
	}
	delay := 5 * time.Millisecond
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			if sameFile(f, path) {
				return &Lock{f: f}, nil
			}
			// The file was removed or replaced while we waited: lock the
			// current one instead.
			f.Close()
			if f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE, perm); err != nil {
				return nil, fmt.Errorf("opening lock %s: %w", path, err)
			}
			continue
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
		if waiting != nil {
			waiting()
			waiting = nil
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			f.Close()
			return nil, fmt.Errorf("waiting for lock %s: %w", path, ctx.Err())
		case <-t.C:
		}
		delay = min(delay*2, 500*time.Millisecond)
	}
}

// Try takes the lock on path (created with perm) if it is free.
func Try(path string, perm os.FileMode) (*Lock, bool, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, perm)
	if err != nil {
		return nil, false, fmt.Errorf("opening lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("locking %s: %w", path, err)
	}
	if !sameFile(f, path) {
		f.Close()
		return nil, false, nil
	}
	return &Lock{f: f}, true, nil
}

// sameFile reports whether the open file f is still the file at path; lock
// files get removed by their owners, and a lock on an unlinked inode guards
// nothing.
func sameFile(f *os.File, path string) bool {
	a, err := f.Stat()
	if err != nil {
		return false
	}
	b, err := os.Stat(path)
	if err != nil {
		return false
	}
	return os.SameFile(a, b)
}

// Release drops the lock. Releasing twice, or a nil Lock, does nothing.
func (l *Lock) Release() {
	if l != nil && l.f != nil {
		_ = syscall.Flock(int(l.f.Fd()), syscall.LOCK_UN)
		_ = l.f.Close()
		l.f = nil
	}
}
