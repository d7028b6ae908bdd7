package vagrantbox

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/agent-vm/agent-vm/internal/atomicfile"
)

// entry is one file of the box: data, or the file at source.
type entry struct {
	name   string
	data   []byte
	source string
}

// writeTar writes entries as an uncompressed tar to path, atomically, with
// every time set to mtime (the same image gives the same bytes), and
// returns the tar's sha256.
func writeTar(ctx context.Context, path string, entries []entry, mtime time.Time) (string, error) {
	h := sha256.New()
	err := atomicfile.WriteFrom(path, 0o644, func(w io.Writer) error {
		tw := tar.NewWriter(io.MultiWriter(w, h))
		for _, e := range entries {
			if err := writeEntry(ctx, tw, e, mtime); err != nil {
				return err
			}
		}
		return tw.Close()
	})
	if err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// writeEntry copies one file; ctx is checked before it (the disk, the one
// large file, takes seconds).
func writeEntry(ctx context.Context, tw *tar.Writer, e entry, mtime time.Time) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	var r io.Reader
	size := int64(len(e.data))
	if e.source != "" {
		f, err := os.Open(e.source)
		if err != nil {
			return fmt.Errorf("box file %s: %w (hint: the image is damaged; rebuild it with `agent-vm image build`)", e.name, err)
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return err
		}
		size, r = fi.Size(), f
	} else {
		r = bytes.NewReader(e.data)
	}
	hdr := &tar.Header{Name: e.name, Mode: 0o644, Size: size, ModTime: mtime, Typeflag: tar.TypeReg, Format: tar.FormatPAX}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if n, err := io.Copy(tw, r); err != nil {
		return fmt.Errorf("box file %s: %w", e.name, err)
	} else if n != size {
		return fmt.Errorf("box file %s changed while it was copied (%d of %d bytes)", e.name, n, size)
	}
	return nil
}
