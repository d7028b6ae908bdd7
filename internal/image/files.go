package image

import (
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash"
	"io"
	"os"

	"github.com/agent-vm/agent-vm/internal/atomicfile"
)

// copyFile copies src to a new file dst with mode perm and syncs it.
func copyFile(src, dst string, perm os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func newHash(algo string) (hash.Hash, error) {
	switch algo {
	case "sha256":
		return sha256.New(), nil
	case "sha512":
		return sha512.New(), nil
	}
	return nil, fmt.Errorf("unsupported checksum algorithm %q", algo)
}

// hashFile reads path once and returns its digest, hex, under each algorithm.
func hashFile(path string, algos ...string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	hs := make(map[string]hash.Hash, len(algos))
	ws := make([]io.Writer, 0, len(algos))
	for _, a := range algos {
		h, err := newHash(a)
		if err != nil {
			return nil, err
		}
		hs[a] = h
		ws = append(ws, h)
	}
	if _, err := io.Copy(io.MultiWriter(ws...), f); err != nil {
		return nil, fmt.Errorf("checksumming %s: %w", path, err)
	}
	out := make(map[string]string, len(hs))
	for a, h := range hs {
		out[a] = hex.EncodeToString(h.Sum(nil))
	}
	return out, nil
}

// writeManifest writes m as indented JSON and syncs it.
func writeManifest(path string, m *Manifest) error {
	b, err := marshalManifest(m)
	if err != nil {
		return err
	}
	return atomicfile.Write(path, b, 0o644)
}

func marshalManifest(m *Manifest) ([]byte, error) {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// formatBytes renders n in binary units, e.g. "753.2 MiB".
func formatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}
