package npmunpack

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"crypto/sha512"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// umask is what npm's modes are masked with: npm's umask (0) over the
// process's usual one (022), as a guest's root runs it.
const umask = 0o022

// unpack installs m, which is plain, under u.Prefix: its tarball checked
// and unpacked beside its directory, then put in its place, then its
// programs linked. On failure the package there before is kept.
func (u Unpacker) unpack(ctx context.Context, m *manifest) (Installed, error) {
	dir := filepath.Join(u.root(), filepath.FromSlash(m.Name))
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return Installed{}, err
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(dir)+"-")
	if err != nil {
		return Installed{}, err
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil {
		return Installed{}, err
	}
	if err := u.fetch(ctx, m, tmp); err != nil {
		return Installed{}, err
	}
	oldBins := installedBins(dir)
	if err := replace(dir, tmp); err != nil {
		return Installed{}, err
	}
	in := Installed{Name: m.Name, Version: m.Version, Dir: dir}
	binDir := filepath.Join(u.Prefix, "bin")
	for b := range oldBins {
		if _, kept := m.bins[b]; !kept {
			unlinkBin(filepath.Join(binDir, b), dir)
		}
	}
	for b, p := range m.bins {
		link := filepath.Join(binDir, b)
		if err := linkBin(link, filepath.Join(dir, filepath.FromSlash(p))); err != nil {
			return in, err
		}
		in.Bins = append(in.Bins, link)
	}
	return in, nil
}

// fetch downloads m's tarball into dir, unpacked, and checks it against
// m's integrity once it has it all: a tarball that fails the check was
// unpacked only in dir, a directory of the caller's that nothing uses
// and that is removed.
func (u Unpacker) fetch(ctx context.Context, m *manifest, dir string) error {
	if t, err := url.Parse(m.Dist.Tarball); err != nil || (t.Scheme != "https" && t.Scheme != "http") || t.Host == "" {
		return fmt.Errorf("the registry's tarball URL %q is not an http(s) URL", m.Dist.Tarball)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.Dist.Tarball, nil)
	if err != nil {
		return err
	}
	resp, err := u.client().Do(req)
	if err != nil {
		return fmt.Errorf("downloading %s: %w", m.Dist.Tarball, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("downloading %s: %s", m.Dist.Tarball, resp.Status)
	}
	// Three goroutines take turns (under TCG each step costs tens of
	// seconds for an agent CLI's 190 MB tarball): the download and its
	// hash, inflating, unpacking.
	sum := sha512.New()
	downloaded := stage(func(w io.Writer) error {
		_, err := io.Copy(io.MultiWriter(w, sum), resp.Body)
		return err
	})
	defer downloaded.Close()
	if err := untar(downloaded, dir, m.bins); err != nil {
		return fmt.Errorf("unpacking %s: %w", m.Dist.Tarball, err)
	}
	// The hash is of the whole file, past the end of the archive.
	if _, err := io.Copy(io.Discard, downloaded); err != nil {
		return fmt.Errorf("downloading %s: %w", m.Dist.Tarball, err)
	}
	return checkIntegrity(m.Dist.Integrity, sum)
}

// stage runs produce on a goroutine of its own, writing into the pipe
// whose reading end it returns; the reader's Close ends it.
func stage(produce func(w io.Writer) error) io.ReadCloser {
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(produce(pw)) }()
	return pr
}

// checkIntegrity compares a sha512 hash with an integrity string's sha512
// entries (Subresource Integrity: "sha512-BASE64", several space-separated):
// one must match.
func checkIntegrity(integrity string, sum hash.Hash) error {
	got := sum.Sum(nil)
	for _, e := range strings.Fields(integrity) {
		b64, ok := strings.CutPrefix(e, "sha512-")
		if !ok {
			continue
		}
		b64, _, _ = strings.Cut(b64, "?")
		want, err := base64.StdEncoding.DecodeString(b64)
		if err == nil && subtle.ConstantTimeCompare(want, got) == 1 {
			return nil
		}
	}
	return fmt.Errorf("the tarball's sha512 is %s, which its manifest's integrity %q does not name (a corrupted or altered download: nothing was installed)",
		base64.StdEncoding.EncodeToString(got), integrity)
}

// untar unpacks a gzipped npm tarball into dir as npm does: the first
// path element of every entry dropped, files and directories only (npm
// skips links), files 0644 or with their executable bits (0755), the
// package's programs executable, directories 0755. An entry that would
// land outside dir fails it.
func untar(r io.Reader, dir string, bins map[string]string) error {
	gz, err := gzip.NewReader(bufio.NewReaderSize(r, 1<<20))
	if err != nil {
		return err
	}
	gz.Multistream(false)
	inflated := stage(func(w io.Writer) error {
		_, err := io.Copy(w, gz)
		return err
	})
	defer inflated.Close()
	programs := map[string]bool{}
	for _, p := range bins {
		programs[p] = true
	}
	tr := tar.NewReader(bufio.NewReaderSize(inflated, 1<<20))
	made := dirs{root: dir, made: map[string]bool{}}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		_, name, _ := strings.Cut(strings.TrimPrefix(h.Name, "./"), "/")
		if strings.Trim(name, "/") == "" {
			continue // the top directory
		}
		clean := path.Clean(name)
		if path.IsAbs(name) || clean == ".." || strings.HasPrefix(clean, "../") || strings.ContainsRune(name, 0) {
			return fmt.Errorf("entry %q would land outside the package", h.Name)
		}
		target := filepath.Join(dir, filepath.FromSlash(clean))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := made.ensure(target); err != nil {
				return err
			}
		case tar.TypeReg, tar.TypeRegA:
			mode := (fs.FileMode(h.Mode)&0o777 | 0o666 | 0o600) &^ umask
			if programs[clean] {
				mode |= 0o111
			}
			if err := made.ensure(filepath.Dir(target)); err != nil {
				return err
			}
			if err := writeFile(target, tr, mode); err != nil {
				return err
			}
		}
	}
	return nil
}

// dirs makes directories under root, 0755, each once: an entry's
// parents are made before it, and a package's thousands of files share a
// few directories.
type dirs struct {
	root string
	made map[string]bool
}

// ensure makes target and its parents under root.
func (d dirs) ensure(target string) error {
	if d.made[target] {
		return nil
	}
	if err := os.MkdirAll(target, 0o755); err != nil {
		return err
	}
	for p := target; p != d.root && strings.HasPrefix(p, d.root) && !d.made[p]; p = filepath.Dir(p) {
		if err := os.Chmod(p, 0o755); err != nil {
			return err
		}
		d.made[p] = true
	}
	return nil
}

func writeFile(target string, r io.Reader, mode fs.FileMode) error {
	f, err := os.OpenFile(target, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, mode)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(target, mode)
	}
	return err
}

// replace puts the unpacked package tmp at dir, the package there before
// moved aside and removed only once tmp is in place.
func replace(dir, tmp string) error {
	old := ""
	if _, err := os.Lstat(dir); err == nil {
		old = tmp + ".old"
		if err := os.Rename(dir, old); err != nil {
			return fmt.Errorf("moving the installed package aside: %w", err)
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		if old != "" {
			_ = os.Rename(old, dir)
		}
		return err
	}
	if old != "" {
		return os.RemoveAll(old)
	}
	return nil
}

// installedBins are the programs of the package installed at dir (none
// when there is none, or its package.json says none).
func installedBins(dir string) map[string]string {
	b, err := os.ReadFile(filepath.Join(dir, "package.json"))
	if err != nil {
		return nil
	}
	var pj struct {
		Name string          `json:"name"`
		Bin  json.RawMessage `json:"bin"`
	}
	if json.Unmarshal(b, &pj) != nil {
		return nil
	}
	bins, _ := readBins(pj.Name, pj.Bin)
	return bins
}

// linkBin makes link a relative symlink to target, replacing a symlink
// there; a file that is not a link is another program's, and refused.
func linkBin(link, target string) error {
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		return err
	}
	if fi, err := os.Lstat(link); err == nil && fi.Mode()&fs.ModeSymlink == 0 {
		return fmt.Errorf("%s is there and is not a link to a package's program (hint: remove it, or install with npm --force)", link)
	}
	rel, err := filepath.Rel(filepath.Dir(link), target)
	if err != nil {
		return err
	}
	tmp := link + ".npmunpack-new"
	_ = os.Remove(tmp)
	if err := os.Symlink(rel, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, link); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return nil
}

// unlinkBin removes link if it is a symlink into the package at dir.
func unlinkBin(link, dir string) {
	dest, err := os.Readlink(link)
	if err != nil {
		return
	}
	if !filepath.IsAbs(dest) {
		dest = filepath.Join(filepath.Dir(link), dest)
	}
	if strings.HasPrefix(dest, dir+string(filepath.Separator)) {
		_ = os.Remove(link)
	}
}
