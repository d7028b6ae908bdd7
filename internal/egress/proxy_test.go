package egress

import (
	"bufio"
	"cmp"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// fixture is a proxy on a loopback listener with a policy file, and
// test names that resolve to servers on the loopback (Hosts): a policy
// that reaches them allows 127.0.0.1 itself, as it would for any name.
type fixture struct {
	t      testing.TB
	p      *Proxy
	dir    string
	url    *url.URL
	policy Policy
	c      *http.Client

	mu       sync.Mutex
	names    map[string][]netip.Addr // resolveTo's answers
	own      []netip.Addr            // pretendOwn's host addresses
	fakeOwn  bool
	ownReads int // how often the proxy listed the host's addresses
}

var loopback = netip.MustParseAddr("127.0.0.1")

func newFixture(t testing.TB, pol Policy) *fixture {
	t.Helper()
	dir := t.TempDir()
	f := &fixture{t: t, dir: dir, policy: pol}
	root := openRoot(t, dir)
	f.p = &Proxy{Dir: root, Log: &Log{Dir: root, Name: LogFile},
		Hosts: map[string]netip.Addr{"allowed.test": loopback, "denied.test": loopback, "sub.wild.test": loopback, "asked.test": loopback},
		Resolve: func(ctx context.Context, host string) ([]netip.Addr, error) {
			if host == "evil.test" { // a public name pointed at the host's loopback
				return []netip.Addr{loopback}, nil
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			if as, ok := f.names[host]; ok {
				return as, nil
			}
			return nil, fmt.Errorf("no such host %s", host)
		},
		InterfaceAddrs: func() ([]netip.Addr, error) {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.ownReads++
			if f.fakeOwn {
				return f.own, nil
			}
			return interfaceAddrs()
		},
		dialContext: func(ctx context.Context, network, address string) (net.Conn, error) {
			// The tests pretend names and addresses are elsewhere; a
			// connection never leaves this machine, whatever the proxy decides.
			if ap, err := netip.ParseAddrPort(address); err != nil || !ap.Addr().Unmap().IsLoopback() {
				t.Errorf("the proxy dialed %s, off this machine", address)
				return nil, fmt.Errorf("the test refuses to dial %s", address)
			}
			var dl net.Dialer
			return dl.DialContext(ctx, network, address)
		}}
	f.setPolicy(pol)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go f.p.ServeProxy(l)
	f.url = &url.URL{Scheme: "http", Host: l.Addr().String()}
	return f
}

// resolveTo makes the proxy's resolver answer addrs for name.
func (f *fixture) resolveTo(name string, addrs ...netip.Addr) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.names == nil {
		f.names = map[string][]netip.Addr{}
	}
	f.names[name] = addrs
}

// pretendOwn makes the proxy see addrs as the host's own addresses, in
// place of its interfaces' (the fixture's default).
func (f *fixture) pretendOwn(addrs ...netip.Addr) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.own, f.fakeOwn = addrs, true
}

func (f *fixture) setPolicy(p Policy) {
	f.t.Helper()
	if err := WritePolicy(f.dir, p); err != nil {
		f.t.Fatal(err)
	}
	// The proxy re-reads on a new modification time; make sure it is new.
	later := time.Now().Add(time.Duration(len(p.Allow)+len(p.Deny)+len(p.Requests)+1) * time.Second)
	_ = os.Chtimes(filepath.Join(f.dir, PolicyFile), later, later)
}

func (f *fixture) client() *http.Client {
	if f.c == nil {
		f.c = &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(f.url),
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, Timeout: 10 * time.Second}
	}
	return f.c
}

func (f *fixture) entries(n int) []LogEntry {
	f.t.Helper()
	// The proxy logs once both directions end: wait for n entries, and
	// return what there is when they do not come (the caller says what
	// it wanted).
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var es []LogEntry
	_ = tu.Poll(ctx, fmt.Sprintf("%d log entries", n), func() bool {
		var err error
		if es, err = ReadLog(filepath.Join(f.dir, LogFile)); err != nil {
			f.t.Fatal(err)
		}
		return len(es) >= n
	})
	return es
}

func port(t *testing.T, u string) string {
	t.Helper()
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	return pu.Port()
}

func TestPlainHTTPAllowed(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Proxy-Connection") != "" {
			t.Errorf("the proxy passed Proxy-Connection on")
		}
		fmt.Fprintf(w, "hello %s", r.Host)
	}))
	defer srv.Close()
	f := newFixture(t, Policy{Branch: "feat", Mode: ModeAllow, Allow: []string{"allowed.test", "127.0.0.1"}})
	resp, err := f.client().Get("http://allowed.test:" + port(t, srv.URL) + "/x")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "hello allowed.test:"+port(t, srv.URL) {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	es := f.entries(1)
	if len(es) != 1 || es[0].Kind != "http" || es[0].Host != "allowed.test" || !es[0].Allowed || es[0].Rule != "allow allowed.test" ||
		es[0].BytesOut == 0 || es[0].BytesIn == 0 {
		t.Fatalf("log = %+v, want one allowed http entry with bytes both ways", es)
	}
}

func TestDeniedCarriesTheHint(t *testing.T) {
	f := newFixture(t, Policy{Branch: "feat-x", Mode: ModeAllow, Allow: []string{"allowed.test"}})
	resp, err := f.client().Get("http://denied.test:81/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	want := "rule: not on the allow-list"
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body), want) ||
		!strings.Contains(string(body), "agent-vm net allow --vm feat-x denied.test") {
		t.Fatalf("got %d %q; want 403 naming the rule and the command", resp.StatusCode, body)
	}
	if h := resp.Header.Get("X-Agent-VM-Denied"); !strings.Contains(h, want) {
		t.Errorf("X-Agent-VM-Denied = %q, want the rule", h)
	}
	es := f.entries(1)
	if len(es) != 1 || es[0].Allowed || es[0].Host != "denied.test" || es[0].Port != 81 || es[0].Rule != "not on the allow-list" {
		t.Fatalf("log = %+v, want one denied entry", es)
	}
}

// Each refusal's hint is the command that lifts that refusal.
func TestDenialHintFitsTheRule(t *testing.T) {
	p := Policy{Mode: ModeAllow, Allow: []string{"allowed.test"}, Deny: []string{"*.npmjs.org"}}
	for host, fix := range map[string]string{
		"other.test":         "agent-vm net allow --vm b other.test\n",
		"registry.npmjs.org": "agent-vm net allow --vm b *.npmjs.org (the refusal that matched)\n",
	} {
		d := p.Decide(host)
		if msg := DenialMessage(LogEntry{Host: host, Port: 443, Rule: d.Rule}, "b"); d.Allowed || !strings.HasSuffix(msg, "on the host with: "+fix) {
			t.Errorf("%s: %+v %q; want the hint %q", host, d, msg, fix)
		}
	}
	p.Mode = ModeOffline
	d := p.Decide("allowed.test")
	if msg := DenialMessage(LogEntry{Host: "allowed.test", Port: 443, Rule: d.Rule}, "b"); d.Allowed || !strings.Contains(msg, "agent-vm net mode --vm b allow (this VM is offline)") {
		t.Errorf("offline: %+v %q", d, msg)
	}
}

func TestConnectTunnelsTLS(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "secret") }))
	defer srv.Close()
	f := newFixture(t, Policy{Branch: "feat", Mode: ModeAllow, Allow: []string{"*.wild.test", "127.0.0.1"}})
	resp, err := f.client().Get("https://sub.wild.test:" + port(t, srv.URL) + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "secret" {
		t.Fatalf("got %q through the tunnel", body)
	}
	// A tunnel is logged when it ends.
	f.client().Transport.(*http.Transport).CloseIdleConnections()
	// The same name, denied: CONNECT answers 403.
	f.setPolicy(Policy{Branch: "feat", Mode: ModeAllow, Allow: []string{"allowed.test"}, Deny: []string{"*.wild.test"}})
	_, err = f.client().Get("https://sub.wild.test:" + port(t, srv.URL) + "/")
	if err == nil || !strings.Contains(err.Error(), "Forbidden by agent-vm") {
		t.Fatalf("a denied CONNECT answered %v, want 403 Forbidden by agent-vm", err)
	}
	// The tunnel's entry is written when its copying ends, which may come
	// after the refusal's: the two are told apart by what they say.
	es := f.entries(2)
	if len(es) == 2 && !es[0].Allowed {
		es[0], es[1] = es[1], es[0]
	}
	if len(es) != 2 || es[0].Kind != "connect" || !es[0].Allowed || es[0].Rule != "allow *.wild.test" || es[0].BytesIn == 0 ||
		es[1].Allowed || es[1].Rule != "deny *.wild.test" {
		t.Fatalf("log = %+v", es)
	}
}

func TestHostIsNeverReachable(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "host secret") }))
	defer srv.Close()
	p := port(t, srv.URL)
	f := newFixture(t, Policy{Branch: "feat", Mode: ModeOpen})
	// allowed.test's loopback address comes from Hosts, which gives no trust.
	for _, u := range []string{"http://127.0.0.1:" + p + "/", "http://evil.test:" + p + "/", "http://[::ffff:127.0.0.1]:" + p + "/", "http://allowed.test:" + p + "/"} {
		resp, err := f.client().Get(u)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden || strings.Contains(string(body), "host secret") {
			t.Errorf("%s in mode open: %d %q; want 403, the host's loopback refused", u, resp.StatusCode, body)
		}
	}
	// An IP literal the user listed is reached.
	f.setPolicy(Policy{Branch: "feat", Mode: ModeAllow, Allow: []string{"127.0.0.1"}})
	resp, err := f.client().Get("http://127.0.0.1:" + p + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("a listed IP literal answered %d, want 200", resp.StatusCode)
	}
}

func TestOfflineAndUnreadablePolicy(t *testing.T) {
	f := newFixture(t, Policy{Branch: "feat", Mode: ModeOffline, Allow: []string{"allowed.test"}})
	resp, err := f.client().Get("http://allowed.test:81/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("offline: %d, want 403", resp.StatusCode)
	}
	os.Remove(filepath.Join(f.dir, PolicyFile))
	resp, err = f.client().Get("http://allowed.test:81/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("no policy: %d, want 403", resp.StatusCode)
	}
}

// runSockets runs a proxy with policy pol on its two unix sockets (the
// proxy's and the exposed ports') in a directory of the test's, until the
// test ends, and returns the directory and the sockets once they are there.
func runSockets(t *testing.T, pol Policy) (dir, proxySock, exposedSock string) {
	t.Helper()
	dir = t.TempDir()
	if err := WritePolicy(dir, pol); err != nil {
		t.Fatal(err)
	}
	root := openRoot(t, dir)
	p := &Proxy{Dir: root, Log: &Log{Dir: root, Name: LogFile}}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	proxySock, exposedSock = filepath.Join(dir, ProxySocket), filepath.Join(dir, ExposedSocket)
	go p.Run(ctx, proxySock, exposedSock)
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	// Listening, not only there: a unix socket's file appears at its bind,
	// a moment before its listen, and a connection between the two is
	// refused (seen in CI). The exposed ports' socket is made last.
	listening := func() bool {
		c, err := net.Dial("unix", exposedSock)
		if err == nil {
			c.Close()
		}
		return err == nil
	}
	if err := tu.Poll(wctx, "the exposed ports' socket", listening); err != nil {
		t.Fatal(err)
	}
	return dir, proxySock, exposedSock
}

// A connection to a port the policy does not expose ends, for the guest,
// with its end, never a reset: here the guest's request comes after its
// preamble, in a write of its own (as Relay sends them) and, in some
// rounds, after the proxy has read the preamble and before it hangs up,
// where a close with that request unread resets the connection.
func TestARefusedPortEndsWithoutAReset(t *testing.T) {
	_, _, exposedSock := runSockets(t, Policy{Branch: "feat", Mode: ModeOffline})
	for i := range 500 {
		c, err := net.Dial("unix", exposedSock)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(c, "40000\n")
		time.Sleep(time.Duration(i%50) * 10 * time.Microsecond)
		c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
		_, err = io.Copy(io.Discard, c)
		c.Close()
		if err != nil {
			t.Fatalf("round %d: the refused connection ended with %v, want its end", i, err)
		}
	}
}

func TestExposedPortsAndRelay(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "mcp") }))
	defer srv.Close()
	var exposed int
	fmt.Sscan(port(t, srv.URL), &exposed)
	dir, proxySock, exposedSock := runSockets(t, Policy{Branch: "feat", Mode: ModeOffline, Exposed: []int{exposed}})
	ctx := context.Background()
	for _, port := range []int{exposed, exposed + 1} {
		var out strings.Builder
		in := strings.NewReader("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
		if err := Relay(ctx, exposedSock, port, in, &out); err != nil {
			t.Fatal(err)
		}
		got := out.String()
		if port == exposed && !strings.HasSuffix(got, "mcp") {
			t.Errorf("the exposed port answered %q", got)
		}
		if port != exposed && got != "" {
			t.Errorf("a port not exposed answered %q", got)
		}
	}
	// The proxy socket never takes an exposed port's preamble as a destination.
	var out strings.Builder
	if err := Relay(ctx, proxySock, 0, strings.NewReader(fmt.Sprintf("%d\n", exposed)), &out); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "mcp") {
		t.Errorf("the proxy socket relayed an exposed port's preamble: %q", out.String())
	}
	// The proxy logs a connection once both its directions end, which may
	// be after the relay returned, and in any order.
	f := &fixture{t: t, dir: dir}
	es := f.entries(2)
	slices.SortFunc(es, func(a, b LogEntry) int { return cmp.Compare(a.Port, b.Port) })
	if len(es) != 2 || es[0].Port != exposed || !es[0].Allowed || es[0].Rule != "exposed" || es[0].Kind != KindExposedPort ||
		es[1].Allowed || es[1].Rule != "not exposed" {
		t.Fatalf("log = %+v", es)
	}
	// Relay to a proxy that is not there fails with a clear error.
	if err := Relay(ctx, filepath.Join(dir, "nothing.sock"), 0, strings.NewReader(""), io.Discard); err == nil ||
		!strings.Contains(err.Error(), "egress proxy") {
		t.Errorf("Relay without a proxy: %v", err)
	}
}

func TestLogIsBounded(t *testing.T) {
	dir := t.TempDir()
	l := &Log{Dir: openRoot(t, dir), Name: LogFile, Limit: 1000}
	path := filepath.Join(dir, LogFile)
	for i := 0; i < 50; i++ {
		if err := l.Add(LogEntry{Host: fmt.Sprintf("h%d.example.com", i), Port: 443, Rule: "mode open", Allowed: true}); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{path, path + ".1"} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() > 1000 || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %d bytes, mode %v; want at most 1000, 0600", p, fi.Size(), fi.Mode().Perm())
		}
	}
	es, err := ReadLog(path)
	if err != nil || len(es) == 0 || es[len(es)-1].Host != "h49.example.com" {
		t.Fatalf("ReadLog: %d entries, %v; want the newest last", len(es), err)
	}
}

func TestFollow(t *testing.T) {
	dir := t.TempDir()
	l := &Log{Dir: openRoot(t, dir), Name: LogFile}
	path := filepath.Join(dir, LogFile)
	l.Add(LogEntry{Host: "old.example.com"})
	fi, _ := os.Stat(path)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	got := make(chan string, 100)
	go Follow(ctx, path, fi.Size(), func(e LogEntry) error { got <- e.Host; return nil })
	next := func() string {
		select {
		case h := <-got:
			return h
		case <-ctx.Done():
			t.Fatal("Follow saw nothing new")
			return ""
		}
	}
	l.Add(LogEntry{Host: "new.example.com"})
	if h := next(); h != "new.example.com" {
		t.Fatalf("Follow saw %q first, want the new entry only", h)
	}
	// A rotation: the new file is read from its start. (Follow has read
	// the old file to its end: it reported the entry above.)
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	l.Add(LogEntry{Host: "rotated.example.com"})
	if h := next(); h != "rotated.example.com" {
		t.Fatalf("Follow saw %q after the rotation", h)
	}
}

// echoServer serves one connection on the loopback, echoing it; it returns
// the port.
func echoServer(t *testing.T) string {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { echo.Close() })
	go func() {
		c, err := echo.Accept()
		if err == nil {
			io.Copy(c, c)
			c.Close()
		}
	}()
	_, p, _ := net.SplitHostPort(echo.Addr().String())
	return p
}

// wantEarlyEcho reads the proxy's 200 for a CONNECT on c, then the echo
// server's "early" through the tunnel, and closes c.
func wantEarlyEcho(t *testing.T, c net.Conn) {
	t.Helper()
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(br, buf); err != nil || string(buf) != "early" {
		t.Fatalf("echo of early bytes: %q %v", buf, err)
	}
	c.Close()
}

// A CONNECT request's bytes that arrive with the request are not lost.
func TestConnectKeepsEarlyBytes(t *testing.T) {
	p := echoServer(t)
	f := newFixture(t, Policy{Branch: "feat", Mode: ModeAllow, Allow: []string{"allowed.test", "127.0.0.1"}})
	c, err := net.Dial("tcp", f.url.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "CONNECT allowed.test:%s HTTP/1.1\r\nHost: allowed.test:%s\r\n\r\nearly", p, p)
	wantEarlyEcho(t, c)
	if es := f.entries(1); len(es) != 1 || es[0].BytesOut != 5 || es[0].BytesIn != 5 {
		t.Fatalf("log = %+v, want 5 bytes each way", es)
	}
}

func TestOrphaned(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "qemu.pid")
	// No pid file within the grace: the proxy must not stay.
	if _, err := WaitPid(context.Background(), pidFile, time.Millisecond); err == nil || !strings.Contains(err.Error(), pidFile) {
		t.Errorf("WaitPid without a pid file: %v", err)
	}
	// A live process: not orphaned; once it exits, orphaned.
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(pidFile, []byte(fmt.Sprintf("%d\n", cmd.Process.Pid)), 0o600)
	pid, err := WaitPid(context.Background(), pidFile, time.Second)
	if err != nil || pid != cmd.Process.Pid {
		t.Fatalf("WaitPid = %d, %v; want %d", pid, err, cmd.Process.Pid)
	}
	ctx := Orphaned(context.Background(), pid)
	select {
	case <-ctx.Done():
		t.Fatal("orphaned while the process lives")
	case <-time.After(1500 * time.Millisecond):
	}
	cmd.Process.Kill()
	cmd.Wait()
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("not orphaned after the process exited")
	}
}

func openRoot(t testing.TB, dir string) *os.Root {
	t.Helper()
	r, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}
