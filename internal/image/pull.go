package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/hostdir"
)

// PullOptions configures Pull. Name and Runner are required.
type PullOptions struct {
	// Name is the image: "debian-12" or "ubuntu-24.04" (see PullNames).
	Name string
	// BaseURL is the directory that holds the image and its checksum list;
	// default the distribution's (cloud.debian.org, cloud-images.ubuntu.com).
	BaseURL string
	// Arch is a GOARCH (amd64, arm64); default runtime.GOARCH.
	Arch string
	// Cache is the image cache (see BuildOptions.Cache); required.
	Cache *hostdir.Dir
	// Force downloads a new version even when one is cached.
	Force bool
	// Attempts bounds how often an interrupted download is resumed within one
	// call; default 3. A partial download that still fails is kept, and the
	// next Pull resumes it.
	Attempts int

	HTTPClient *http.Client     // nil: a client with sensible timeouts
	Runner     execx.Runner     // runs qemu-img info on the download
	Progress   io.Writer        // phase and byte-count lines; nil discards
	Logger     hclog.Logger     // nil: no logging
	Now        func() time.Time // nil: time.Now
}

// PullNames lists the images Pull knows.
func PullNames() []string { return []string{"debian-12", "ubuntu-24.04"} }

// remote is one downloadable cloud image.
type remote struct {
	release  string // the distribution's codename
	arch     string // the distribution's name for the architecture
	baseURL  string // directory URL, no trailing slash
	file     string // the image's file name in it
	sumsFile string // the checksum list's file name in it
	algo     string // the checksum list's algorithm
}

func (r remote) url() string     { return r.baseURL + "/" + r.file }
func (r remote) sumsURL() string { return r.baseURL + "/" + r.sumsFile }

func remoteFor(name, goarch, baseURL string) (remote, error) {
	var r remote
	switch name {
	case "debian-12":
		r = remote{release: "bookworm", baseURL: "https://cloud.debian.org/images/cloud/bookworm/latest", sumsFile: "SHA512SUMS", algo: "sha512"}
	case "ubuntu-24.04":
		r = remote{release: "noble", baseURL: "https://cloud-images.ubuntu.com/noble/current", sumsFile: "SHA256SUMS", algo: "sha256"}
	default:
		return remote{}, fmt.Errorf("unknown image %q (hint: choose one of %s)", name, strings.Join(PullNames(), ", "))
	}
	switch goarch {
	case "amd64", "arm64": // both distributions use Go's names for these
		r.arch = goarch
	default:
		return remote{}, fmt.Errorf("no official %s cloud image for %s (hint: pass --image with a disk image for this architecture)", name, goarch)
	}
	if strings.HasPrefix(name, "debian-") {
		r.file = fmt.Sprintf("debian-12-generic-%s.qcow2", r.arch)
	} else {
		r.file = fmt.Sprintf("noble-server-cloudimg-%s.img", r.arch)
	}
	if baseURL != "" {
		if !strings.HasPrefix(baseURL, "http://") && !strings.HasPrefix(baseURL, "https://") {
			return remote{}, fmt.Errorf("invalid base URL %q (hint: use an http(s) URL of the directory that holds %s and %s)", baseURL, r.file, r.sumsFile)
		}
		r.baseURL = strings.TrimRight(baseURL, "/")
	}
	return r, nil
}

// Pull returns the cached cloud image called opts.Name, downloading it first
// when it is not cached (or Force is set). The download is verified against
// the distribution's checksum list, resumed with HTTP ranges when
// interrupted, discarded when its checksum is wrong, and published into the
// cache by rename only when complete.
func Pull(ctx context.Context, opts PullOptions) (*Image, error) {
	p, err := newPuller(opts)
	if err != nil {
		return nil, err
	}
	return p.run(ctx)
}

type puller struct {
	opts    PullOptions
	remote  remote
	log     hclog.Logger
	out     io.Writer
	now     func() time.Time
	geteuid func() int
	dl      *downloader
}

func newPuller(opts PullOptions) (*puller, error) {
	if opts.Runner == nil {
		return nil, errors.New("image pull: no runner")
	}
	if opts.Arch == "" {
		opts.Arch = runtime.GOARCH
	}
	r, err := remoteFor(opts.Name, opts.Arch, opts.BaseURL)
	if err != nil {
		return nil, err
	}
	if opts.Cache == nil {
		return nil, errNoCache
	}
	if opts.Attempts <= 0 {
		opts.Attempts = 3
	}
	p := &puller{opts: opts, remote: r, log: opts.Logger, out: opts.Progress, now: opts.Now, geteuid: os.Geteuid}
	if p.log == nil {
		p.log = hclog.NewNullLogger()
	}
	p.log = p.log.Named("image").With("image", opts.Name)
	if p.out == nil {
		p.out = io.Discard
	}
	if p.now == nil {
		p.now = time.Now
	}
	client := opts.HTTPClient
	if client == nil {
		client = defaultHTTPClient()
	}
	p.dl = &downloader{client: client, out: p.out, now: p.now, log: p.log, attempts: opts.Attempts,
		backoff: 2 * time.Second, stall: 60 * time.Second}
	return p, nil
}

func (p *puller) run(ctx context.Context) (*Image, error) {
	start := p.now()
	st, err := openStore(p.opts.Cache, p.geteuid())
	if err != nil {
		return nil, err
	}
	unlock, err := st.lock(ctx, p.opts.Name, p.out)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if img, err := Lookup(st.root, p.opts.Name); err == nil && img.Manifest.Kind == KindPulled &&
		img.Manifest.Arch == p.remote.arch && (!p.opts.Force || !img.Manifest.Created.Before(start)) {
		fmt.Fprintf(p.out, "==> using cached image %s (downloaded %s)\n", img.Name, img.Manifest.Created.Local().Format(time.DateTime))
		return img, nil
	}
	if err := st.sweep(p.opts.Name); err != nil {
		return nil, err
	}
	v, err := p.download(ctx, st)
	if err != nil {
		return nil, err
	}
	return p.publish(st, v)
}

// verified is a complete download that matched its published checksum and
// is a standalone disk image.
type verified struct {
	part     string // the file, still in .partial/
	disk     *Disk
	sha256   string
	checksum string // "<algo>:<hex>" as published
	meta     partialMeta
}

// download fetches the checksum list, then the image (resuming a partial
// one), and verifies it. Whatever fails verification is discarded.
func (p *puller) download(ctx context.Context, st *store) (*verified, error) {
	r := p.remote
	fmt.Fprintf(p.out, "==> fetching the checksum list %s\n", r.sumsURL())
	sums, err := p.dl.small(ctx, r.sumsURL(), 1<<20)
	if err != nil {
		return nil, err
	}
	want, err := findChecksum(sums, r.file, r.algo)
	if err != nil {
		return nil, fmt.Errorf("checksum list %s: %w", r.sumsURL(), err)
	}

	partDir := st.dir.Sub(partialDir, 0o755).Sub(p.opts.Name, 0o755)
	if err := st.mkdir(partDir); err != nil {
		return nil, err
	}
	part := filepath.Join(partDir.Path, r.file+".part")
	fmt.Fprintf(p.out, "==> downloading %s\n", r.url())
	meta, err := p.dl.fetch(ctx, r.url(), part)
	st.own(part) // a partial download left for the next run stays usable by the cache's owner
	st.own(part + metaSuffix)
	if err != nil {
		return nil, err
	}

	fmt.Fprintf(p.out, "==> verifying the %s checksum\n", r.algo)
	got, err := hashFile(part, r.algo, "sha256")
	if err != nil {
		return nil, err
	}
	if got[r.algo] != want {
		discardPartial(part)
		return nil, fmt.Errorf("checksum mismatch for %s: got %s %s, want %s from %s; the download was discarded (hint: run the pull again; if it fails again the mirror may be mid-update, try later)",
			r.url(), r.algo, got[r.algo], want, r.sumsURL())
	}
	disk, err := Inspect(ctx, p.opts.Runner, part)
	if err == nil && disk.BackingFile != "" {
		err = fmt.Errorf("it is a qcow2 overlay of %s, not a standalone image", disk.BackingFile)
	}
	if err != nil {
		discardPartial(part)
		return nil, fmt.Errorf("%s matches its checksum but is not a usable disk image (the download was discarded): %w", r.url(), err)
	}
	return &verified{part: part, disk: disk, sha256: got["sha256"], checksum: r.algo + ":" + want, meta: meta}, nil
}

// publish moves a verified download into the cache with its manifest.
func (p *puller) publish(st *store, v *verified) (*Image, error) {
	if err := syncFile(v.part); err != nil {
		return nil, err
	}
	fi, err := os.Stat(v.part)
	if err != nil {
		return nil, err
	}
	work, err := st.tempDir(p.opts.Name)
	if err != nil {
		return nil, err
	}
	published := false
	defer func() {
		if !published {
			_ = removeTree(work)
		}
	}()
	r := p.remote
	diskFile := "disk." + v.disk.Format
	if err := os.Rename(v.part, filepath.Join(work, diskFile)); err != nil {
		return nil, err
	}
	m := &Manifest{
		Schema: manifestSchema, Name: p.opts.Name, Kind: KindPulled, BuilderVersion: BuilderVersion,
		Created: p.now().UTC().Round(0), Arch: r.arch, Release: r.release,
		Disk: diskFile, Format: v.disk.Format, SizeBytes: fi.Size(), VirtualSizeBytes: v.disk.VirtualSize, SHA256: v.sha256,
		SourceURL: r.url(), ChecksumURL: r.sumsURL(), Checksum: v.checksum,
		ETag: v.meta.ETag, LastModified: v.meta.LastModified,
	}
	if err := writeManifest(filepath.Join(work, ManifestFile), m); err != nil {
		return nil, err
	}
	dir, err := st.publish(p.opts.Name, work, m.Created)
	if err != nil {
		return nil, err
	}
	published = true
	discardPartial(v.part)
	img, err := load(p.opts.Name, dir)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(p.out, "==> pulled %s: %s (%s, %s virtual)\n", img.Name, img.Disk, formatBytes(m.SizeBytes), formatBytes(m.VirtualSizeBytes))
	return img, nil
}

// discardPartial removes a partial download and its metadata.
func discardPartial(part string) {
	_ = os.Remove(part)
	_ = os.Remove(part + metaSuffix)
}

// findChecksum finds file's digest in a checksum list in GNU coreutils format
// ("<hex>  <name>" or "<hex> *<name>") or BSD format ("SHA256 (<name>) = <hex>").
func findChecksum(list []byte, file, algo string) (string, error) {
	hexLen := map[string]int{"sha256": 64, "sha512": 128}[algo]
	for _, line := range strings.Split(string(list), "\n") {
		line = strings.TrimSpace(line)
		var sum, name string
		if rest, ok := strings.CutPrefix(line, strings.ToUpper(algo)+" ("); ok {
			name, sum, _ = strings.Cut(rest, ") = ")
		} else if f := strings.Fields(line); len(f) == 2 {
			sum, name = f[0], strings.TrimPrefix(f[1], "*")
		}
		if name != file {
			continue
		}
		sum = strings.ToLower(sum)
		if len(sum) != hexLen || strings.Trim(sum, "0123456789abcdef") != "" {
			return "", fmt.Errorf("the entry for %s is not a %s digest: %q", file, algo, sum)
		}
		return sum, nil
	}
	return "", fmt.Errorf("no entry for %s (hint: the image may have been renamed or removed upstream; check the base URL)", file)
}
