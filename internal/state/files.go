package state

import (
	"context"
	"os"
	"path/filepath"

	"github.com/agent-vm/agent-vm/internal/flock"
)

// Lock is a held lock of the state directory (see package flock).
type Lock = flock.Lock

// AcquireLock takes the lock on path, waiting until it is free or ctx ends.
func AcquireLock(ctx context.Context, path string) (*Lock, error) {
	return flock.Acquire(ctx, path, 0o600, nil)
}

// TryLock takes the lock on path if it is free.
func TryLock(path string) (*Lock, bool, error) { return flock.Try(path, 0o600) }

// removeAll removes a tree even where the guest or git left directories
// without write permission (RemoveAll fails on those).
func removeAll(path string) error {
	err := os.RemoveAll(path)
	if err == nil {
		return nil
	}
	_ = filepath.WalkDir(path, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() && d.Type()&os.ModeSymlink == 0 {
			_ = os.Chmod(p, 0o700)
		}
		return nil
	})
	return os.RemoveAll(path)
}
