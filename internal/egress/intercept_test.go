package egress

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func testCA(t testing.TB, name string) *CA {
	t.Helper()
	cp, kp, err := NewCA(name)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := LoadCA(cp, kp)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func pool(cas ...*CA) *x509.CertPool {
	p := x509.NewCertPool()
	for _, ca := range cas {
		p.AddCert(ca.Certificate())
	}
	return p
}

// upstream is a TLS server for name on the loopback, with a certificate
// from its own CA (the test's stand-in for the public PKI), that records
// the requests it gets.
type upstream struct {
	ca   *CA
	port int
	mu   sync.Mutex
	got  []*http.Request
	body []string
}

func newUpstream(t testing.TB, name string) *upstream {
	t.Helper()
	u := &upstream{ca: testCA(t, "upstream")}
	u.port = serveTLS(t, u.ca, name, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.got, u.body = append(u.got, r), append(u.body, string(b))
		u.mu.Unlock()
		if r.URL.Path == "/chunked" {
			w.(http.Flusher).Flush()
		}
		fmt.Fprintf(w, "answer to %s %s", r.Method, r.URL.Path)
	}))
	return u
}

// serveTLS serves h over TLS on the loopback as name, with a certificate
// from ca, until the test ends, and returns its port.
func serveTLS(t testing.TB, ca *CA, name string, h http.Handler) int {
	t.Helper()
	leaf, err := ca.leaf(name)
	if err != nil {
		t.Fatal(err)
	}
	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{*leaf}})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l.Addr().(*net.TCPAddr).Port
}

func (u *upstream) requests() ([]*http.Request, []string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]*http.Request(nil), u.got...), append([]string(nil), u.body...)
}

// A stand-in for the secret swap the proxy is given (the boundary): TOKEN
// is bound to allowed.test, OTHER to elsewhere.test.
func swap(host string, req *http.Request) ([]string, error) {
	var names []string
	for k, vs := range req.Header {
		for i, v := range vs {
			if strings.Contains(v, "PH-OTHER") {
				return nil, errors.New("placeholder of OTHER sent to " + host + ": refused")
			}
			if strings.Contains(v, "PH-TOKEN") && host == "allowed.test" {
				req.Header[k][i] = strings.ReplaceAll(v, "PH-TOKEN", "real-token-value")
				names = append(names, "TOKEN")
			}
		}
	}
	return names, nil
}

// interceptFixture: a proxy that intercepts allowed.test on up's port,
// and a client that trusts the VM's CA only (as the guest does).
func interceptFixture(t testing.TB, up *upstream) (*fixture, *http.Client, *CA) {
	t.Helper()
	f := newFixture(t, Policy{Branch: "feat", Mode: ModeAllow, Allow: []string{"allowed.test", "127.0.0.1"}})
	vmCA := testCA(t, "feat")
	f.p.Intercept = &Interceptor{CA: vmCA, Ports: []int{up.port}, RootCAs: pool(up.ca), Rewrite: swap,
		Bound: func(host string) bool { return host == "allowed.test" }}
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(f.url),
		TLSClientConfig: &tls.Config{RootCAs: pool(vmCA)}}}
	return f, c, vmCA
}

// The placeholder the guest sends reaches the bound host as the secret,
// in a tunnel whose TLS the guest verified against its VM's CA and the
// proxy against the host's; several requests share the tunnel, bodies
// pass (Content-Length, chunked, Expect: 100-continue) and each request
// is a log entry with the secret's name.
func TestInterceptPutsTheSecretIn(t *testing.T) {
	up := newUpstream(t, "allowed.test")
	f, c, _ := interceptFixture(t, up)
	base := "https://allowed.test:" + strconv.Itoa(up.port)
	do := func(method, path, body string, hdr map[string]string) string {
		t.Helper()
		var r io.Reader
		if body != "" {
			r = strings.NewReader(body)
		}
		req, _ := http.NewRequest(method, base+path, r)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		if path == "/chunked" {
			req.ContentLength = -1
			req.Body = io.NopCloser(strings.NewReader(body))
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, b)
		}
		return string(b)
	}
	if got := do("GET", "/v1/models", "", map[string]string{"Authorization": "Bearer PH-TOKEN"}); got != "answer to GET /v1/models" {
		t.Errorf("the guest read %q", got)
	}
	do("POST", "/v1/messages", "a body", map[string]string{"X-Api-Key": "PH-TOKEN", "Expect": "100-continue"})
	do("POST", "/chunked", strings.Repeat("x", 100000), nil)
	reqs, bodies := up.requests()
	if len(reqs) != 3 {
		t.Fatalf("the host got %d requests, want 3", len(reqs))
	}
	if a := reqs[0].Header.Get("Authorization"); a != "Bearer real-token-value" {
		t.Errorf("the host got Authorization %q, want the secret", a)
	}
	if k := reqs[1].Header.Get("X-Api-Key"); k != "real-token-value" || bodies[1] != "a body" {
		t.Errorf("the host got X-Api-Key %q and body %q", k, bodies[1])
	}
	if len(bodies[2]) != 100000 {
		t.Errorf("the chunked body arrived with %d bytes, want 100000", len(bodies[2]))
	}
	es := f.entries(3)
	if len(es) != 3 {
		t.Fatalf("log = %+v, want an entry per request", es)
	}
	for i, want := range []string{"GET /v1/models", "POST /v1/messages", "POST /chunked"} {
		e := es[i]
		secrets := fmt.Sprint(e.Secrets)
		if e.Kind != "https" || e.Request != want || !e.Allowed || e.Host != "allowed.test" || e.BytesOut == 0 || e.BytesIn == 0 ||
			(i < 2) != (secrets == "[TOKEN]") {
			t.Errorf("entry %d = %+v, want an allowed https entry for %s", i, e, want)
		}
	}
	if strings.Contains(fmt.Sprint(es), "real-token-value") {
		t.Errorf("the log holds the secret: %+v", es)
	}
}

// Refusals: a placeholder of a secret bound elsewhere (the host sees
// nothing), a request for another host inside the tunnel, a guest asking
// for another name in its TLS, a host whose certificate does not verify,
// and a placeholder over plain HTTP.
func TestInterceptRefuses(t *testing.T) {
	up := newUpstream(t, "allowed.test")
	f, c, vmCA := interceptFixture(t, up)
	base := "https://allowed.test:" + strconv.Itoa(up.port)
	status := func(req *http.Request) (int, string) {
		t.Helper()
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", req.URL, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	req, _ := http.NewRequest("GET", base+"/x", nil)
	req.Header.Set("Authorization", "token PH-OTHER")
	if code, body := status(req); code != http.StatusForbidden || !strings.Contains(body, "placeholder of OTHER sent to allowed.test: refused") {
		t.Errorf("a placeholder bound elsewhere: %d %q", code, body)
	}
	req, _ = http.NewRequest("GET", base+"/y", nil)
	req.Host = "elsewhere.test"
	if code, body := status(req); code != http.StatusMisdirectedRequest || !strings.Contains(body, "a request for elsewhere.test in a tunnel to allowed.test") {
		t.Errorf("another Host in the tunnel: %d %q", code, body)
	}
	if reqs, _ := up.requests(); len(reqs) != 0 {
		t.Errorf("the host got %d refused requests", len(reqs))
	}

	// The guest's TLS asks for another name than its CONNECT.
	conn, err := net.Dial("tcp", f.url.Host)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "CONNECT allowed.test:%d HTTP/1.1\r\nHost: allowed.test\r\n\r\n", up.port)
	buf := make([]byte, len("HTTP/1.1 200 Connection established\r\n\r\n"))
	if _, err := io.ReadFull(conn, buf); err != nil {
		t.Fatal(err)
	}
	tc := tls.Client(conn, &tls.Config{ServerName: "elsewhere.test", RootCAs: pool(vmCA)})
	if err := tc.Handshake(); err == nil {
		t.Errorf("a TLS handshake for elsewhere.test in a tunnel to allowed.test succeeded")
	}
	conn.Close()

	// A host whose certificate the proxy cannot verify (signed by a CA it
	// does not trust).
	f.p.Intercept.RootCAs = pool(testCA(t, "someone else"))
	if code, body := status(mustRequest(t, base+"/z")); code != http.StatusBadGateway || !strings.Contains(body, "could not be reached over TLS") {
		t.Errorf("an unverifiable host: %d %q", code, body)
	}

	// Plain HTTP: the secret would cross in the clear.
	plain := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(f.url)}}
	req, _ = http.NewRequest("GET", "http://allowed.test:"+strconv.Itoa(up.port)+"/plain", nil)
	req.Header.Set("Authorization", "Bearer PH-TOKEN")
	resp, err := plain.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(b), "a secret is sent over TLS only: the placeholder of TOKEN was sent to http://allowed.test") {
		t.Errorf("a placeholder over plain HTTP: %d %q", resp.StatusCode, b)
	}

	es := f.entries(6)
	var rules []string
	for _, e := range es {
		if e.Allowed && e.Error == "" {
			t.Errorf("entry %+v allowed", e)
		}
		rules = append(rules, e.Rule+e.Error)
	}
	for _, want := range []string{"placeholder of OTHER sent to allowed.test: refused", "a request for elsewhere.test in a tunnel to allowed.test",
		"TLS with the guest", "TLS with allowed.test", "a secret is sent over TLS only"} {
		if !strings.Contains(strings.Join(rules, "\n"), want) {
			t.Errorf("no log entry says %q: %q", want, rules)
		}
	}
}

// A CONNECT to a host no secret is bound to stays a tunnel: the guest
// gets the host's own certificate.
func TestInterceptLeavesOtherHostsAlone(t *testing.T) {
	up := newUpstream(t, "allowed.test")
	f, _, _ := interceptFixture(t, up)
	f.p.Intercept.Bound = func(string) bool { return false }
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(f.url),
		TLSClientConfig: &tls.Config{RootCAs: pool(up.ca)}}}
	req := mustRequest(t, "https://allowed.test:"+strconv.Itoa(up.port)+"/t")
	req.Header.Set("Authorization", "Bearer PH-TOKEN")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	reqs, _ := up.requests()
	if len(reqs) != 1 || reqs[0].Header.Get("Authorization") != "Bearer PH-TOKEN" {
		t.Errorf("the host got %v, want the placeholder untouched", reqs)
	}
	c.Transport.(*http.Transport).CloseIdleConnections()
	if es := f.entries(1); len(es) != 1 || es[0].Kind != "connect" {
		t.Errorf("log = %+v, want one connect entry", es)
	}
}

// A VM's CA signs a certificate per host that verifies against it alone,
// made once; LoadCA refuses what is not a CA.
func TestCA(t *testing.T) {
	ca := testCA(t, "feat")
	leaf, err := ca.leaf("api.example.com")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: "api.example.com", Roots: pool(ca)}); err != nil {
		t.Errorf("the leaf does not verify against its CA: %v", err)
	}
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: "api.example.com", Roots: pool(testCA(t, "other"))}); err == nil {
		t.Errorf("the leaf verifies against another VM's CA")
	}
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: "other.example.com", Roots: pool(ca)}); err == nil {
		t.Errorf("the leaf verifies for another name")
	}
	if again, _ := ca.leaf("api.example.com"); again != leaf {
		t.Errorf("a second leaf for the same host was made")
	}
	ca.now = func() time.Time { return time.Now().Add(leafValidity) }
	if renewed, _ := ca.leaf("api.example.com"); renewed == leaf {
		t.Errorf("a leaf near its end was not renewed")
	}
	cp, _, _ := NewCA("x")
	_, kp, _ := NewCA("y")
	if _, err := LoadCA(cp, []byte("junk")); err == nil {
		t.Errorf("LoadCA took a junk key")
	}
	if _, err := LoadCA(cp, kp); err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Errorf("LoadCA took another CA's key: %v", err)
	}
}

func mustRequest(t *testing.T, u string) *http.Request {
	t.Helper()
	r, err := http.NewRequest("GET", u, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// The time a request takes through the proxy after the handshakes, on a
// kept-alive connection: intercepted (TLS ended and begun again, the
// headers rewritten) against a plain tunnel to the same host.
func BenchmarkRequestIntercepted(b *testing.B) { benchRequest(b, true) }
func BenchmarkRequestTunnelled(b *testing.B)   { benchRequest(b, false) }

func benchRequest(b *testing.B, intercepted bool) {
	up := newUpstream(b, "allowed.test")
	f, c, _ := interceptFixture(b, up)
	if !intercepted {
		f.p.Intercept.Bound = func(string) bool { return false }
		c.Transport.(*http.Transport).TLSClientConfig.RootCAs = pool(up.ca)
	}
	u := "https://allowed.test:" + strconv.Itoa(up.port) + "/bench"
	get := func() {
		req, _ := http.NewRequest("GET", u, nil)
		req.Header.Set("Authorization", "Bearer PH-TOKEN")
		resp, err := c.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	get() // the handshakes
	b.ResetTimer()
	for range b.N {
		get()
	}
}

// A request head over 1 MiB is refused, in a tunnel and in plain HTTP,
// and the proxy goes on serving.
func TestHugeHeadIsRefused(t *testing.T) {
	up := newUpstream(t, "allowed.test")
	f, c, _ := interceptFixture(t, up)
	big := strings.Repeat("x", 2<<20)
	req := mustRequest(t, "https://allowed.test:"+strconv.Itoa(up.port)+"/big")
	req.Header.Set("X-Big", big)
	if resp, err := c.Do(req); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Errorf("a 2 MiB head in the tunnel: %d", resp.StatusCode)
		}
	}
	conn, err := net.Dial("tcp", f.url.Host)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "GET http://allowed.test:%d/ HTTP/1.1\r\nHost: allowed.test\r\nX-Big: %s\r\n\r\n", up.port, big)
	b, _ := io.ReadAll(io.LimitReader(conn, 200))
	conn.Close()
	if !strings.HasPrefix(string(b), "HTTP/1.1 431") {
		t.Errorf("a 2 MiB plain head: %q", b)
	}
	if reqs, _ := up.requests(); len(reqs) != 0 {
		t.Errorf("the host got %d requests", len(reqs))
	}
	req = mustRequest(t, "https://allowed.test:"+strconv.Itoa(up.port)+"/after")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("after the huge heads: %v", err)
	}
	resp.Body.Close()
}

// When the host cannot be reached over TLS, the proxy's 502 comes after
// the guest's request, never before it: an HTTP client takes an answer
// that comes before its request for a broken connection, and never
// shows it.
func TestInterceptAnswersAnUnreachableHostAfterTheRequest(t *testing.T) {
	up := newUpstream(t, "allowed.test")
	f, _, vmCA := interceptFixture(t, up)
	f.p.Intercept.RootCAs = pool(testCA(t, "someone else"))
	conn, err := net.Dial("tcp", f.url.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "CONNECT allowed.test:%d HTTP/1.1\r\nHost: allowed.test\r\n\r\n", up.port)
	buf := make([]byte, len("HTTP/1.1 200 Connection established\r\n\r\n"))
	if _, err := io.ReadFull(conn, buf); err != nil {
		t.Fatal(err)
	}
	tc := tls.Client(conn, &tls.Config{ServerName: "allowed.test", RootCAs: pool(vmCA)})
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	tc.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	if n, err := tc.Read(make([]byte, 1)); n > 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("before any request the proxy sent %d bytes (%v), want nothing", n, err)
	}
	tc.SetReadDeadline(time.Time{})
	fmt.Fprintf(tc, "GET /z HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(b), "could not be reached over TLS") {
		t.Errorf("after the request: %d %q, want the 502", resp.StatusCode, b)
	}
}
