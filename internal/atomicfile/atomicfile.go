// Package atomicfile is agent-vm's one way to replace a file: the content
// goes to a temporary file in the same directory, which is synced, renamed
// over the target and the directory synced, so readers see the old content
// or the new, never a torn one, even after a host crash.
package atomicfile

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// Write replaces path with b (mode perm).
func Write(path string, b []byte, perm os.FileMode) error {
	return WriteFrom(path, perm, func(w io.Writer) error {
		_, err := w.Write(b)
		return err
	})
}

// WriteJSON replaces path (mode perm) with v as indented JSON and a
// newline.
func WriteJSON(path string, v any, perm os.FileMode) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return Write(path, append(b, '\n'), perm)
}

// WriteOwned is Write of a file owned by uid:gid, set before it replaces
// path (root writing a user's file).
func WriteOwned(path string, b []byte, perm os.FileMode, uid, gid int) error {
	return WriteFrom(path, perm, func(w io.Writer) error {
		if err := w.(*os.File).Chown(uid, gid); err != nil { // WriteFrom hands write its temporary file
			return err
		}
		_, err := w.Write(b)
		return err
	})
}

// WriteFrom replaces path (mode perm) with what write writes; when write
// fails, path is left as it was.
func WriteFrom(path string, perm os.FileMode, write func(io.Writer) error) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // a no-op after the rename
	err = f.Chmod(perm)
	if err == nil {
		err = write(f)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err == nil {
		err = SyncDir(dir)
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// SyncDir makes renames and new entries in dir durable. Filesystems that
// cannot sync a directory (EINVAL) have nothing to make durable that way.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, syscall.EINVAL) {
		return err
	}
	return nil
}

// SyncFS writes out everything written to the filesystem that holds path
// (syncfs(2)): one call for a tree of files written without a sync each,
// made durable before the tree is renamed into place.
func SyncFS(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("writing out the files under %s: %w", path, err)
	}
	return nil
}
