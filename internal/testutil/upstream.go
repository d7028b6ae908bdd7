package testutil

import (
	"bytes"
	"cmp"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"
)

// Upstream is a web server "outside" the host, for tests of the egress
// proxy against a destination that is neither loopback nor one of the
// host's own addresses: it listens in a network namespace of its own on
// the second address of a /30 of 198.18.0.0/15, joined to the host by a
// veth pair whose end on the host has the first (NewUpstream). It answers
// HTTPS with a certificate from a CA of the test's, records every request
// it gets (Requests), and serves git's smart HTTP for the bare
// repositories BareRepo makes.
type Upstream struct {
	// Addr is where it listens: HTTPS on port 443, plain HTTP on 80.
	Addr netip.Addr
	// HostAddr is the veth's address on the host's side: one of the
	// host's own.
	HostAddr netip.Addr
	// CAPEM is the certificate of the CA that signed the server's, in
	// PEM, for the code under test to trust (CertPool is it parsed).
	CAPEM string
	// Names are the DNS names the server's certificate holds, besides
	// Addr.
	Names []string
	// Password is the Basic password a git push must carry.
	Password string
	// Namespace and Link name the network namespace (/run/netns/Namespace)
	// and the veth's end on the host; both are gone after the test.
	Namespace, Link string

	ca    *x509.Certificate
	mux   *http.ServeMux
	repos string // the bare repositories, served under /git/
	git   sync.Once

	mu  sync.Mutex
	got []UpstreamRequest
}

// UpstreamOptions are NewUpstream's.
type UpstreamOptions struct {
	// Names are the DNS names of the server's certificate; none is
	// "upstream.test" and "other.test".
	Names []string
	// Password is the Basic password a git push must carry; "" is
	// "upstream-password".
	Password string
}

// UpstreamRequest is a request as an Upstream received it.
type UpstreamRequest struct {
	Method string
	Host   string // as the request named it, port and all
	Path   string
	Query  string
	// TLS says it came over HTTPS, not plain HTTP.
	TLS     bool
	Header  http.Header
	BodyLen int64
}

// NewUpstream starts an Upstream in a new network namespace (it needs
// root and ip: it skips, or fails under AGENT_VM_TEST_STRICT=1, without
// them). The test's cleanup stops it and removes the namespace and the
// veth pair, also when the test fails.
func NewUpstream(t testing.TB, o UpstreamOptions) *Upstream {
	t.Helper()
	ns := newNetns(t)
	names := o.Names
	if len(names) == 0 {
		names = []string{"upstream.test", "other.test"}
	}
	caPEM, ca, caKey := SelfSigned(t, "agent-vm test upstream CA", true)
	leaf := Leaf(t, ca, caKey, append(slices.Clone(names), ns.peer.String())...)
	u := &Upstream{Addr: ns.peer, HostAddr: ns.host, CAPEM: caPEM, Names: names,
		Password: cmp.Or(o.Password, "upstream-password"), Namespace: ns.name, Link: ns.link,
		ca: ca, mux: http.NewServeMux(), repos: t.TempDir()}
	u.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "upstream: %s %s%s\n", r.Method, r.Host, r.URL.Path)
	})
	ls, err := ns.listen(netip.AddrPortFrom(u.Addr, 443).String(), netip.AddrPortFrom(u.Addr, 80).String())
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(u.serve), ReadHeaderTimeout: 30 * time.Second}
	go srv.Serve(tls.NewListener(ls[0], &tls.Config{Certificates: []tls.Certificate{leaf}}))
	go srv.Serve(ls[1])
	t.Cleanup(func() {
		srv.Close()
		for _, l := range ls {
			l.Close()
		}
	})
	return u
}

// serve records a request, its body read whole, and passes it on.
func (u *Upstream) serve(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, "reading the body: "+err.Error(), http.StatusBadRequest)
		return
	}
	u.mu.Lock()
	u.got = append(u.got, UpstreamRequest{Method: r.Method, Host: r.Host, Path: r.URL.Path, Query: r.URL.RawQuery,
		TLS: r.TLS != nil, Header: r.Header.Clone(), BodyLen: int64(len(b))})
	u.mu.Unlock()
	r.Body, r.ContentLength, r.TransferEncoding = io.NopCloser(bytes.NewReader(b)), int64(len(b)), nil
	u.mux.ServeHTTP(w, r)
}

// Requests returns the requests received so far, in order: a copy.
func (u *Upstream) Requests() []UpstreamRequest {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := slices.Clone(u.got)
	for i := range out {
		out[i].Header = out[i].Header.Clone()
	}
	return out
}

// Handle adds a route (http.ServeMux's pattern); every path not routed
// otherwise is answered 200 with the request's method, host and path.
func (u *Upstream) Handle(pattern string, h http.Handler) { u.mux.Handle(pattern, h) }

// CertPool is a pool of the CA that signed the server's certificate.
func (u *Upstream) CertPool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(u.ca)
	return p
}

// BareRepo makes a bare repository name.git that takes pushes, served
// with git http-backend (GitHTTP) under /git/: a push must carry Basic
// credentials with Password, and is answered 401 otherwise. It returns
// the repository's directory and its path on the server.
func (u *Upstream) BareRepo(t testing.TB, name string) (dir, urlPath string) {
	t.Helper()
	h := GitHTTP(t, u.repos, u.Password)
	u.git.Do(func() { u.mux.Handle("/git/", http.StripPrefix("/git", h)) })
	Git(t, u.repos, "init", "--quiet", "--bare", "--initial-branch=main", name+".git")
	dir = filepath.Join(u.repos, name+".git")
	Git(t, dir, "config", "http.receivepack", "true")
	return dir, "/git/" + name + ".git"
}
