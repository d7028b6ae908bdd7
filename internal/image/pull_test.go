package image

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/testutil"
)

// mirror is a local stand-in for cloud.debian.org / cloud-images.ubuntu.com:
// it serves files with real HTTP range support (http.ServeContent), and can
// be told to fail, cut transfers short or stall.
type mirror struct {
	t   *testing.T
	srv *httptest.Server

	mu       sync.Mutex
	files    map[string][]byte
	etags    map[string]string
	status   map[string]int // path -> forced status
	cutAfter int64          // >0: cut the next `cuts` image transfers after this many body bytes
	cuts     int
	stall    bool // with a cut: hang instead of closing
	noRange  bool // ignore Range headers (always 200 with the whole file)
	requests []request
}

type request struct {
	Path, Range, IfRange string
}

func newMirror(t *testing.T) *mirror {
	m := &mirror{t: t, files: map[string][]byte{}, etags: map[string]string{}, status: map[string]int{}}
	m.srv = httptest.NewServer(http.HandlerFunc(m.serve))
	t.Cleanup(m.srv.Close)
	return m
}

func (m *mirror) put(path string, content []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.files[path] = content
	sum := sha256.Sum256(content)
	m.etags[path] = `"` + hex.EncodeToString(sum[:8]) + `"`
}

func (m *mirror) requestsFor(path string) []request {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []request
	for _, r := range m.requests {
		if r.Path == path {
			out = append(out, r)
		}
	}
	return out
}

func (m *mirror) serve(w http.ResponseWriter, r *http.Request) {
	m.mu.Lock()
	m.requests = append(m.requests, request{r.URL.Path, r.Header.Get("Range"), r.Header.Get("If-Range")})
	content, ok := m.files[r.URL.Path]
	etag := m.etags[r.URL.Path]
	code := m.status[r.URL.Path]
	cut := int64(0)
	if m.cuts > 0 && !strings.HasSuffix(r.URL.Path, "SUMS") {
		m.cuts--
		cut = m.cutAfter
	}
	stall, noRange := m.stall, m.noRange
	m.mu.Unlock()

	if code != 0 {
		http.Error(w, http.StatusText(code), code)
		return
	}
	if !ok {
		http.NotFound(w, r)
		return
	}
	var out http.ResponseWriter = w
	if cut > 0 {
		out = &cutWriter{ResponseWriter: w, left: cut, stall: stall, done: r.Context().Done()}
	}
	if noRange {
		w.Header().Set("Content-Length", fmt.Sprint(len(content)))
		w.WriteHeader(http.StatusOK)
		_, _ = out.Write(content)
		return
	}
	w.Header().Set("ETag", etag)
	http.ServeContent(out, r, "", time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC), bytes.NewReader(content))
}

// cutWriter passes through `left` body bytes, then drops the connection (or
// hangs until the client goes away).
type cutWriter struct {
	http.ResponseWriter
	left  int64
	stall bool
	done  <-chan struct{}
}

func (c *cutWriter) Write(p []byte) (int, error) {
	if int64(len(p)) <= c.left {
		c.left -= int64(len(p))
		return c.ResponseWriter.Write(p)
	}
	n, _ := c.ResponseWriter.Write(p[:c.left])
	c.left = 0
	c.ResponseWriter.(http.Flusher).Flush()
	if c.stall {
		<-c.done
	}
	_ = n
	panic(http.ErrAbortHandler) // the server closes the connection mid-body
}

// testDisk returns a real qcow2 image with a few MiB of random data.
func testDisk(t *testing.T) []byte {
	t.Helper()
	testutil.Program(t, "qemu-img")
	dir := t.TempDir()
	raw := filepath.Join(dir, "data.raw")
	data := make([]byte, 3<<20)
	_, _ = rand.Read(data)
	if err := os.WriteFile(raw, data, 0o644); err != nil {
		t.Fatal(err)
	}
	q := filepath.Join(dir, "disk.qcow2")
	run(t, "qemu-img", "convert", "-q", "-f", "raw", "-O", "qcow2", raw, q)
	b, err := os.ReadFile(q)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func sha512hex(b []byte) string { s := sha512.Sum512(b); return hex.EncodeToString(s[:]) }
func sha256hex(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

const debianFile = "debian-12-generic-amd64.qcow2"

// serveDebian puts a Debian-style directory on the mirror: the image and a
// SHA512SUMS that lists it among other files.
func serveDebian(m *mirror, disk []byte) {
	m.put("/debian/"+debianFile, disk)
	m.put("/debian/SHA512SUMS", []byte(fmt.Sprintf("%s  debian-12-generic-amd64.json\n%s  %s\n%s  debian-12-generic-amd64.raw\n",
		strings.Repeat("a", 128), sha512hex(disk), debianFile, strings.Repeat("b", 128))))
}

// testPuller returns a puller against the mirror with fast retries.
func testPuller(t *testing.T, m *mirror, cache string, opts PullOptions) (*puller, *strings.Builder) {
	t.Helper()
	var progress strings.Builder
	if opts.Name == "" {
		opts.Name = "debian-12"
	}
	if opts.Arch == "" {
		opts.Arch = "amd64"
	}
	if opts.BaseURL == "" {
		opts.BaseURL = m.srv.URL + "/debian/"
	}
	opts.Cache, opts.Runner, opts.Progress = cacheAt(cache), execx.OS{}, &syncBuilder{b: &progress}
	p, err := newPuller(opts)
	if err != nil {
		t.Fatal(err)
	}
	p.dl.backoff = time.Millisecond
	p.dl.stall = 500 * time.Millisecond
	return p, &progress
}

// syncBuilder lets the download goroutine and the test share a builder.
type syncBuilder struct {
	mu sync.Mutex
	b  *strings.Builder
}

func (s *syncBuilder) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func partialFiles(t *testing.T, cache string) []string {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(cache, partialDir, "*", "*"))
	return m
}

func checkPulled(t *testing.T, img *Image, disk []byte) {
	t.Helper()
	got, err := os.ReadFile(img.Disk)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, disk) {
		t.Fatalf("cached disk (%d bytes) differs from the served one (%d bytes)", len(got), len(disk))
	}
	if img.Manifest.SHA256 != sha256hex(disk) || img.Manifest.SizeBytes != int64(len(disk)) {
		t.Errorf("manifest sha256/size: got %s/%d", img.Manifest.SHA256, img.Manifest.SizeBytes)
	}
}

func TestPullDebian(t *testing.T) {
	disk := testDisk(t)
	m := newMirror(t)
	serveDebian(m, disk)
	cache := t.TempDir()
	p, progress := testPuller(t, m, cache, PullOptions{})
	img, err := p.run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	checkPulled(t, img, disk)
	mf := img.Manifest
	url := m.srv.URL + "/debian/" + debianFile
	if mf.Kind != KindPulled || mf.Name != "debian-12" || mf.Release != "bookworm" || mf.Arch != "amd64" ||
		mf.Format != "qcow2" || mf.VirtualSizeBytes != 3<<20 || mf.SourceURL != url ||
		mf.ChecksumURL != m.srv.URL+"/debian/SHA512SUMS" || mf.Checksum != "sha512:"+sha512hex(disk) || mf.ETag == "" {
		t.Errorf("manifest: %+v", mf)
	}
	if img.Kernel != "" || img.Cmdline != "" || filepath.Base(img.Disk) != "disk.qcow2" {
		t.Errorf("a cloud image boots through its own bootloader: got kernel %q, cmdline %q, disk %q", img.Kernel, img.Cmdline, img.Disk)
	}
	for _, want := range []string{"downloading " + url, "MiB", "done in", "verifying the sha512 checksum", "pulled debian-12"} {
		if !strings.Contains(progress.String(), want) {
			t.Errorf("progress lacks %q:\n%s", want, progress)
		}
	}
	if left := partialFiles(t, cache); len(left) > 0 {
		t.Errorf("partial files left: %q", left)
	}
	looked, err := Lookup(cache, "debian-12")
	if err != nil || looked.Disk != img.Disk {
		t.Errorf("lookup: got %v, %v", looked, err)
	}

	// Pulling again uses the cache without downloading.
	before := len(m.requestsFor("/debian/" + debianFile))
	p2, progress2 := testPuller(t, m, cache, PullOptions{})
	img2, err := p2.run(context.Background())
	if err != nil || img2.Disk != img.Disk {
		t.Fatalf("second pull: %v, %v", img2, err)
	}
	if after := len(m.requestsFor("/debian/" + debianFile)); after != before {
		t.Errorf("second pull downloaded again (%d requests)", after-before)
	}
	if !strings.Contains(progress2.String(), "using cached image debian-12") {
		t.Errorf("progress: %q", progress2)
	}
}

func TestPullUbuntuArm64WithBinaryMarkerSums(t *testing.T) {
	disk := testDisk(t)
	m := newMirror(t)
	file := "noble-server-cloudimg-arm64.img"
	m.put("/noble/"+file, disk)
	m.put("/noble/SHA256SUMS", []byte(fmt.Sprintf("%s *noble-server-cloudimg-amd64.img\n%s *%s\n", strings.Repeat("c", 64), sha256hex(disk), file)))
	p, _ := testPuller(t, m, t.TempDir(), PullOptions{Name: "ubuntu-24.04", Arch: "arm64", BaseURL: m.srv.URL + "/noble"})
	img, err := p.run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	checkPulled(t, img, disk)
	if img.Manifest.Arch != "arm64" || img.Manifest.Release != "noble" || img.Manifest.Checksum != "sha256:"+sha256hex(disk) ||
		filepath.Base(img.Disk) != "disk.qcow2" {
		t.Errorf("manifest: %+v", img.Manifest)
	}
}

func TestPullResumesWithinOneCall(t *testing.T) {
	disk := testDisk(t)
	m := newMirror(t)
	serveDebian(m, disk)
	m.cutAfter, m.cuts = 1<<20, 1
	p, progress := testPuller(t, m, t.TempDir(), PullOptions{})
	img, err := p.run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	checkPulled(t, img, disk)
	reqs := m.requestsFor("/debian/" + debianFile)
	if len(reqs) != 2 {
		t.Fatalf("got %d image requests, want 2: %+v", len(reqs), reqs)
	}
	if reqs[0].Range != "" || reqs[1].Range != "bytes=1048576-" || reqs[1].IfRange != m.etags["/debian/"+debianFile] {
		t.Errorf("requests: got %+v, want a plain GET then Range bytes=1048576- with If-Range", reqs)
	}
	if !strings.Contains(progress.String(), "resuming at 1.0 MiB") {
		t.Errorf("progress does not mention the resume:\n%s", progress)
	}
}

func TestPullTruncatedKeepsPartialAndNextPullResumes(t *testing.T) {
	disk := testDisk(t)
	m := newMirror(t)
	serveDebian(m, disk)
	m.cutAfter, m.cuts = 1<<20, 1
	cache := t.TempDir()
	p, _ := testPuller(t, m, cache, PullOptions{Attempts: 1})
	_, err := p.run(context.Background())
	wantErr(t, err, "interrupted after 1.0 MiB", "run the pull again to resume")
	if _, lerr := Lookup(cache, "debian-12"); !errors.Is(lerr, ErrNotFound) {
		t.Errorf("an image was published after a failed pull: %v", lerr)
	}
	part := filepath.Join(cache, partialDir, "debian-12", debianFile+".part")
	if fi, err := os.Stat(part); err != nil || fi.Size() != 1<<20 {
		t.Fatalf("partial download: %v %v, want 1 MiB kept", fi, err)
	}

	p2, _ := testPuller(t, m, cache, PullOptions{Attempts: 1})
	img, err := p2.run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	checkPulled(t, img, disk)
	reqs := m.requestsFor("/debian/" + debianFile)
	if last := reqs[len(reqs)-1]; last.Range != "bytes=1048576-" {
		t.Errorf("second pull: got Range %q, want bytes=1048576-", last.Range)
	}
}

func TestPullRestartsWhenTheFileChanged(t *testing.T) {
	old, updated := testDisk(t), testDisk(t)
	m := newMirror(t)
	serveDebian(m, old)
	m.cutAfter, m.cuts = 1<<20, 1
	cache := t.TempDir()
	p, _ := testPuller(t, m, cache, PullOptions{Attempts: 1})
	if _, err := p.run(context.Background()); err == nil {
		t.Fatal("first pull should have been cut short")
	}
	serveDebian(m, updated) // the mirror publishes a new image (new ETag, new sums)
	p2, progress := testPuller(t, m, cache, PullOptions{Attempts: 1})
	img, err := p2.run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	checkPulled(t, img, updated) // not the old first MiB + the new rest
	if !strings.Contains(progress.String(), "starting over") {
		t.Errorf("progress does not say it started over:\n%s", progress)
	}
}

func TestPullServerWithoutRanges(t *testing.T) {
	disk := testDisk(t)
	m := newMirror(t)
	serveDebian(m, disk)
	m.cutAfter, m.cuts, m.noRange = 1<<20, 1, true
	p, _ := testPuller(t, m, t.TempDir(), PullOptions{})
	img, err := p.run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	checkPulled(t, img, disk)
}

func TestPullStalledTransferIsResumed(t *testing.T) {
	disk := testDisk(t)
	m := newMirror(t)
	serveDebian(m, disk)
	m.cutAfter, m.cuts, m.stall = 1<<20, 1, true
	p, progress := testPuller(t, m, t.TempDir(), PullOptions{})
	img, err := p.run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	checkPulled(t, img, disk)
	if !strings.Contains(progress.String(), "stalled") {
		t.Errorf("progress does not mention the stall:\n%s", progress)
	}
}

func TestPullWrongChecksumDiscards(t *testing.T) {
	disk := testDisk(t)
	m := newMirror(t)
	m.put("/debian/"+debianFile, disk)
	wrong := strings.Repeat("0", 128)
	m.put("/debian/SHA512SUMS", []byte(wrong+"  "+debianFile+"\n"))
	cache := t.TempDir()
	p, _ := testPuller(t, m, cache, PullOptions{})
	_, err := p.run(context.Background())
	wantErr(t, err, "checksum mismatch", m.srv.URL+"/debian/"+debianFile, "want "+wrong, "discarded", "hint:")
	if left := partialFiles(t, cache); len(left) > 0 {
		t.Errorf("partial files left after a checksum mismatch: %q", left)
	}
	if _, lerr := Lookup(cache, "debian-12"); !errors.Is(lerr, ErrNotFound) {
		t.Errorf("an image was published: %v", lerr)
	}
	if left, _ := filepath.Glob(filepath.Join(cache, tmpDir, "*")); len(left) > 0 {
		t.Errorf("work files left: %q", left)
	}
}

func TestPullChecksumListWithoutTheFile(t *testing.T) {
	disk := testDisk(t)
	m := newMirror(t)
	m.put("/debian/"+debianFile, disk)
	m.put("/debian/SHA512SUMS", []byte(sha512hex(disk)+"  debian-12-genericcloud-amd64.qcow2\n"))
	p, _ := testPuller(t, m, t.TempDir(), PullOptions{})
	_, err := p.run(context.Background())
	wantErr(t, err, m.srv.URL+"/debian/SHA512SUMS", "no entry for "+debianFile)
	if n := len(m.requestsFor("/debian/" + debianFile)); n != 0 {
		t.Errorf("downloaded the image (%d requests) without a checksum to verify it", n)
	}
}

func TestPullHTTPErrors(t *testing.T) {
	disk := testDisk(t)
	for _, tc := range []struct {
		name     string
		path     string
		code     int
		attempts int // requests expected for the failing path
		want     []string
	}{
		{"image 404", "/debian/" + debianFile, 404, 1, []string{"404 Not Found", "check the base URL"}},
		{"sums 404", "/debian/SHA512SUMS", 404, 1, []string{"404 Not Found"}},
		{"image 500", "/debian/" + debianFile, 500, 3, []string{"500 Internal Server Error", "try again later"}},
		{"image 403", "/debian/" + debianFile, 403, 1, []string{"403 Forbidden"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newMirror(t)
			serveDebian(m, disk)
			m.status[tc.path] = tc.code
			cache := t.TempDir()
			p, _ := testPuller(t, m, cache, PullOptions{Attempts: 3})
			_, err := p.run(context.Background())
			wantErr(t, err, append([]string{"fetching " + m.srv.URL + tc.path}, tc.want...)...)
			if n := len(m.requestsFor(tc.path)); n != tc.attempts {
				t.Errorf("got %d requests for %s, want %d", n, tc.path, tc.attempts)
			}
			if _, lerr := Lookup(cache, "debian-12"); !errors.Is(lerr, ErrNotFound) {
				t.Errorf("an image was published: %v", lerr)
			}
		})
	}
}

func TestPullRejectsAFileThatIsNotADisk(t *testing.T) {
	m := newMirror(t)
	notDisk := bytes.Repeat([]byte("<html>moved</html>\n"), 100000)
	m.put("/debian/"+debianFile, notDisk)
	m.put("/debian/SHA512SUMS", []byte(sha512hex(notDisk)+"  "+debianFile+"\n"))
	testutil.Program(t, "qemu-img")
	cache := t.TempDir()
	p, _ := testPuller(t, m, cache, PullOptions{})
	_, err := p.run(context.Background())
	wantErr(t, err, "not a usable disk image", "discarded")
	if left := partialFiles(t, cache); len(left) > 0 {
		t.Errorf("partial files left: %q", left)
	}
}

func TestPullCancelKeepsPartial(t *testing.T) {
	disk := testDisk(t)
	m := newMirror(t)
	serveDebian(m, disk)
	m.cutAfter, m.cuts, m.stall = 1<<20, 1, true
	cache := t.TempDir()
	p, _ := testPuller(t, m, cache, PullOptions{})
	p.dl.stall = time.Minute
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		// Cancel once the first MiB is on disk.
		part := filepath.Join(cache, partialDir, "debian-12", debianFile+".part")
		if testutil.Poll(ctx, "the first MiB on disk", func() bool { fi, err := os.Stat(part); return err == nil && fi.Size() == 1<<20 }) == nil {
			cancel()
		}
	}()
	_, err := p.run(ctx)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	if left := partialFiles(t, cache); len(left) != 2 {
		t.Errorf("want the partial file and its metadata kept for a resume, got %q", left)
	}
}

func TestPullOptionErrors(t *testing.T) {
	for _, tc := range []struct {
		opts PullOptions
		want string
	}{
		{PullOptions{Name: "fedora-41"}, "unknown image \"fedora-41\" (hint: choose one of debian-12, ubuntu-24.04)"},
		{PullOptions{Name: "debian-12", Arch: "riscv64"}, "no official debian-12 cloud image for riscv64"},
		{PullOptions{Name: "debian-12", Arch: "amd64", BaseURL: "ftp://x"}, "invalid base URL"},
	} {
		tc.opts.Runner, tc.opts.Cache = execx.OS{}, cacheAt(t.TempDir())
		_, err := Pull(context.Background(), tc.opts)
		wantErr(t, err, tc.want)
	}
}

func TestFindChecksum(t *testing.T) {
	sum := strings.Repeat("ab", 32)
	for _, tc := range []struct{ list, want, err string }{
		{sum + "  f.img\n", sum, ""},
		{sum + " *f.img\n", sum, ""},
		{"SHA256 (f.img) = " + strings.ToUpper(sum) + "\n", sum, ""},
		{sum + "  other.img\n", "", "no entry for f.img"},
		{"xyz  f.img\n", "", "not a sha256 digest"},
		{sum + "  f.img.sig\n", "", "no entry"},
	} {
		got, err := findChecksum([]byte(tc.list), "f.img", "sha256")
		if tc.err != "" {
			wantErr(t, err, tc.err)
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q: got %q, %v", tc.list, got, err)
		}
	}
}
