// Package wsfile reads files of a workspace the guest can write: the host
// side must never follow a symlink the guest made (it could name
// /etc/shadow, or anything else of the host's), nor block on a FIFO, nor
// read without bound.
package wsfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrNotRegular is a path that is a symlink, or not a regular file, or
// that goes through a symlink or a non-directory.
var ErrNotRegular = errors.New("not a regular file of the workspace")

// Read returns the content of rel (a relative, slash-separated path) in
// the workspace root, opening each component without following symlinks.
// A missing file is fs.ErrNotExist; a symlink, FIFO, device or directory
// on the way is ErrNotRegular; a file over limit bytes is an error.
func Read(root, rel string, limit int64) ([]byte, error) {
	parts := strings.Split(filepath.ToSlash(filepath.Clean(rel)), "/")
	if filepath.IsAbs(rel) || parts[0] == ".." || rel == "" {
		return nil, fmt.Errorf("%s: not a path inside the workspace", rel)
	}
	dir, err := unix.Open(root, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: root, Err: err}
	}
	for i, p := range parts {
		flags := unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NOFOLLOW | unix.O_NONBLOCK
		if i < len(parts)-1 {
			flags |= unix.O_DIRECTORY
		}
		fd, err := unix.Openat(dir, p, flags, 0)
		unix.Close(dir)
		switch {
		case errors.Is(err, unix.ENOENT):
			return nil, &fs.PathError{Op: "open", Path: rel, Err: fs.ErrNotExist}
		case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR):
			return nil, &fs.PathError{Op: "open", Path: rel, Err: ErrNotRegular}
		case err != nil:
			return nil, &fs.PathError{Op: "open", Path: rel, Err: err}
		}
		dir = fd
	}
	f := os.NewFile(uintptr(dir), filepath.Join(root, rel))
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, &fs.PathError{Op: "open", Path: rel, Err: ErrNotRegular}
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", rel, limit)
	}
	return b, nil
}
