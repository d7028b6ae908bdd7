package harness

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// Scanned is how much GrepTree read.
type Scanned struct {
	Files int
	Bytes int64
}

// GrepTree lists the files under root that contain needle (a secret the
// scenarios check is nowhere it must not be).
func GrepTree(root string, needle []byte) ([]string, Scanned, error) {
	var hits []string
	var sc Scanned
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		found, n, err := fileContains(p, needle)
		if err != nil {
			return err
		}
		sc.Files++
		sc.Bytes += n
		if found {
			hits = append(hits, p)
		}
		return nil
	})
	return hits, sc, err
}

// fileContains reads the file in chunks that overlap by len(needle)-1.
func fileContains(path string, needle []byte) (bool, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
			return false, 0, nil
		}
		return false, 0, err
	}
	defer f.Close()
	buf := make([]byte, 4<<20)
	keep := len(needle) - 1
	var total int64
	have := 0
	for {
		n, err := f.Read(buf[have:])
		total += int64(n)
		if bytes.Contains(buf[:have+n], needle) {
			return true, total, nil
		}
		if err == io.EOF {
			return false, total, nil
		}
		if err != nil {
			return false, total, err
		}
		if have+n > keep {
			copy(buf, buf[have+n-keep:have+n])
			have = keep
		} else {
			have += n
		}
	}
}
