package egress

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// The TCP front, served by Serve as net-proxy serves it: the proxy port
// judges requests by the policy, each exposed port leads to its host port
// while the policy exposes it (and stops at once when it no longer does),
// a port listed but not exposed leads nowhere, and the ports file
// names every listener.
func TestFrontServesProxyAndExposedPorts(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "exposed") }))
	defer srv.Close()
	exposed, _ := strconv.Atoi(port(t, srv.URL))
	other := exposed + 1
	dir := t.TempDir()
	if err := WritePolicy(dir, Policy{Branch: "feat", Mode: ModeOffline, Exposed: []int{exposed}}); err != nil {
		t.Fatal(err)
	}
	ports := filepath.Join(dir, "front.json")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, ServeOptions{Dir: dir,
			Front: &Front{Addr: netip.MustParseAddr("127.0.0.1"), Exposed: []int{exposed, other, exposed}, PortsFile: ports}})
	}()
	var fp FrontPorts
	fp = waitFrontPorts(t, ports)
	if fi, err := os.Stat(ports); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("ports file: %v %v, want 0600", fi.Mode(), err)
	}
	if fp.Addr != "127.0.0.1" || len(fp.Exposed) != 2 || fp.Exposed[exposed] == 0 || fp.Exposed[other] == 0 || fp.Exposed[exposed] == fp.Proxy {
		t.Fatalf("ports = %+v", fp)
	}
	get := func(p int, req string) string {
		c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(c, req)
		b, _ := io.ReadAll(c)
		return string(b)
	}
	plain := "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
	if got := get(fp.Exposed[exposed], plain); !strings.HasSuffix(got, "exposed") {
		t.Errorf("the exposed port answered %q", got)
	}
	if got := get(fp.Exposed[other], plain); got != "" {
		t.Errorf("a port not exposed answered %q", got)
	}
	if got := get(fp.Proxy, "GET http://example.test/ HTTP/1.1\r\nHost: example.test\r\nConnection: close\r\n\r\n"); !strings.Contains(got, " 403 ") || !strings.Contains(got, "mode offline") {
		t.Errorf("the proxy port answered %q, want the offline refusal", got)
	}
	if err := WritePolicy(dir, Policy{Branch: "feat", Mode: ModeOffline}); err != nil {
		t.Fatal(err)
	}
	if got := get(fp.Exposed[exposed], plain); got != "" {
		t.Errorf("an exposed port taken away answered %q", got)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not end with its context")
	}
	if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", fp.Proxy), time.Second); err == nil {
		c.Close()
		t.Error("the front still listens after Serve ended")
	}
}

// A front that cannot listen (240.0.0.1: reserved, never a host's) fails
// Serve with the address, and leaves no
// ports file; a proxy with neither sockets nor a front is refused.
func TestFrontRefusals(t *testing.T) {
	dir := t.TempDir()
	ports := filepath.Join(dir, "front.json")
	for _, tc := range []struct {
		f    Front
		want string
	}{
		{Front{Addr: netip.MustParseAddr("240.0.0.1"), PortsFile: ports}, "cannot listen on 240.0.0.1"},
		{Front{Addr: netip.MustParseAddr("127.0.0.1"), Exposed: []int{70000}, PortsFile: ports}, "exposed port 70000"},
		{Front{Addr: netip.MustParseAddr("127.0.0.1")}, "internal error"},
	} {
		err := Serve(context.Background(), ServeOptions{Dir: dir, ProxySocket: filepath.Join(dir, ProxySocket), ExposedSocket: filepath.Join(dir, ExposedSocket), Front: &tc.f})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.f, err, tc.want)
		}
		if _, err := os.Stat(ports); err == nil {
			t.Errorf("%+v left a ports file", tc.f)
		}
	}
	if err := Serve(context.Background(), ServeOptions{Dir: dir, ProxySocket: filepath.Join(dir, ProxySocket)}); err == nil || !strings.Contains(err.Error(), "sockets") {
		t.Errorf("one socket, no front: %v", err)
	}
}

// With an exposed-port directory (a VM placed on another host), an exposed port
// is reached at DIR/PORT, a unix socket standing for the user's machine, and
// never at this host's 127.0.0.1:PORT, where another server listens here.
func TestFrontExposedThroughExposedDir(t *testing.T) {
	local := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "this host") }))
	defer local.Close()
	exposed, _ := strconv.Atoi(port(t, local.URL))
	dir, sockets := t.TempDir(), t.TempDir()
	l, err := net.Listen("unix", filepath.Join(sockets, strconv.Itoa(exposed)))
	if err != nil {
		t.Fatal(err)
	}
	away := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "the user's machine") }))
	away.Listener = l
	away.Start()
	defer away.Close()
	if err := WritePolicy(dir, Policy{Branch: "feat", Mode: ModeOffline, Exposed: []int{exposed}}); err != nil {
		t.Fatal(err)
	}
	ports := filepath.Join(dir, "front.json")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	defer func() {
		cancel()
		<-done
	}()
	go func() {
		done <- Serve(ctx, ServeOptions{Dir: dir, ExposedDir: sockets,
			Front: &Front{Addr: netip.MustParseAddr("127.0.0.1"), Exposed: []int{exposed}, PortsFile: ports}})
	}()
	var fp FrontPorts
	fp = waitFrontPorts(t, ports)
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(fp.Exposed[exposed])), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	b, _ := io.ReadAll(c)
	if !strings.HasSuffix(string(b), "the user's machine") {
		t.Errorf("the exposed port answered %q, want the exposed-port socket's server", b)
	}
}

// waitFrontPorts waits for the front's ports file and reads it.
func waitFrontPorts(t *testing.T, ports string) FrontPorts {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var fp FrontPorts
	var err error
	if perr := tu.Poll(ctx, "the ports file "+ports, func() bool { fp, err = ReadFrontPorts(ports); return err == nil }); perr != nil {
		t.Fatalf("%v: %v", perr, err)
	}
	return fp
}
