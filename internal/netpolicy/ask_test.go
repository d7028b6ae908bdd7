package netpolicy

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/state"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// askProxy runs a real egress proxy over the fake VM's network directory,
// as the VM's would, and returns a client that goes through it. The test
// name asked.test leads to the loopback, which the VM's allow-list has
// (any name's address must be allowed to be reached there).
func askProxy(t *testing.T, vms *fakeVMs) *http.Client {
	t.Helper()
	root, err := os.OpenRoot(DirOf(vms.e.Layout))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	p := &egress.Proxy{Dir: root, Log: &egress.Log{Dir: root, Name: egress.LogFile},
		Hosts: map[string]netip.Addr{"asked.test": netip.MustParseAddr("127.0.0.1")}}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go p.ServeProxy(l)
	return &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: l.Addr().String()})}, Timeout: 20 * time.Second}
}

func getLater(c *http.Client, u string) <-chan string {
	got := make(chan string, 1)
	go func() {
		resp, err := c.Get(u)
		if err != nil {
			got <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		got <- fmt.Sprintf("%d %s", resp.StatusCode, b)
	}()
	return got
}

func waitAsks(t *testing.T, vms *fakeVMs, n int) []egress.Ask {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var p *Pending
	err := tu.Poll(ctx, fmt.Sprintf("%d asks", n), func() bool {
		var err error
		if p, err = Asks(ctx, vms, "feat"); err != nil {
			t.Fatal(err)
		}
		return len(p.Asks) == n
	})
	if err != nil {
		t.Fatalf("%v: %+v", err, p)
	}
	return p.Asks
}

// net mode ask, net pending, net approve|deny through a real proxy: an
// unlisted name is held and listed; approved with --always it goes
// through and joins the allow-list; refused, every ask of that name ends.
func TestAskThroughTheProxy(t *testing.T) {
	ctx := context.Background()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hi") }))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	vms := newFakeVMs(t, &state.Record{Net: &state.Net{Mode: egress.ModeAllow, Allow: []string{"127.0.0.1"}}})
	if _, err := SetMode(ctx, vms, "feat", egress.ModeAsk, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	pol, err := egress.ReadPolicy(DirOf(vms.e.Layout))
	if err != nil || pol.Mode != egress.ModeAsk || pol.AskWait != 30 {
		t.Fatalf("policy = %+v, %v; want mode ask, 30 s", pol, err)
	}
	if p, err := Asks(ctx, vms, "feat"); err != nil || len(p.Asks) != 0 {
		t.Fatalf("asks of a stopped VM: %+v, %v", p, err)
	}
	if _, err := Answer(ctx, vms, "feat", []int{1}, true, false); err == nil || !strings.Contains(err.Error(), "does not run") {
		t.Fatalf("answer to a stopped VM: %v", err)
	}
	vms.running = true
	c := askProxy(t, vms)
	got := getLater(c, "http://asked.test:"+port+"/")
	a := waitAsks(t, vms, 1)[0]
	if a.Host != "asked.test" || a.Method != "GET" || a.Until.Sub(a.Time) != 30*time.Second {
		t.Fatalf("ask = %+v", a)
	}
	if _, err := Answer(ctx, vms, "feat", []int{a.ID + 1}, true, false); err == nil ||
		!strings.Contains(err.Error(), fmt.Sprintf("no ask %d is pending for VM feat", a.ID+1)) {
		t.Fatalf("answer to an ask not pending: %v", err)
	}
	res, err := Answer(ctx, vms, "feat", []int{a.ID}, true, true)
	if err != nil {
		t.Fatal(err)
	}
	if s := <-got; s != "200 hi" {
		t.Fatalf("approved: %s", s)
	}
	if len(res.Asks) != 1 || res.Change == nil || !slices.Contains(res.Change.Info.Added, "asked.test") {
		t.Fatalf("answered = %+v", res)
	}
	var es []egress.LogEntry
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_ = tu.Poll(pctx, "the log entry", func() bool { es, err = egress.ReadLog(LogPath(vms.e.Layout)); return len(es) > 0 })
	if err != nil || len(es) != 1 || es[0].Rule != fmt.Sprintf("approved by the user, and allowed from now on (ask %d)", a.ID) {
		t.Fatalf("log = %+v, %v", es, err)
	}

	// Two held for one name: one ID refuses both.
	vms.running = false
	if _, err := Deny(ctx, vms, "feat", []string{"127.0.0.2"}); err != nil { // any change: the policy is written again
		t.Fatal(err)
	}
	r, _ := state.ReadRecord(vms.e.Layout.Record())
	r.Net.Allow = []string{"127.0.0.1"}
	if err := state.WriteRecord(vms.e.Layout.Record(), r); err != nil {
		t.Fatal(err)
	}
	if _, err := SetMode(ctx, vms, "feat", egress.ModeAsk, 0); err != nil {
		t.Fatal(err)
	}
	vms.running = true
	g1, g2 := getLater(c, "http://asked.test:"+port+"/1"), getLater(c, "http://asked.test:"+port+"/2")
	asks := waitAsks(t, vms, 2)
	if res, err = Answer(ctx, vms, "feat", []int{asks[1].ID}, false, false); err != nil || len(res.Asks) != 2 || res.Change != nil {
		t.Fatalf("refusing one of two asks of a name: %+v, %v", res, err)
	}
	for _, g := range []<-chan string{g1, g2} {
		if s := <-g; !strings.Contains(s, "403") || !strings.Contains(s, "refused by the user (ask ") {
			t.Fatalf("refused: %s", s)
		}
	}
	if b, err := os.ReadFile(filepath.Join(DirOf(vms.e.Layout), egress.AnswersFile)); err != nil || strings.Contains(string(b), a.Token) {
		t.Errorf("answers kept for an ask no longer pending: %s, %v", b, err)
	}
}

// Mode ask's refusals: --wait with another mode or out of range, and a VM
// placed on another host (its proxy is there).
func TestAskRefused(t *testing.T) {
	ctx := context.Background()
	vms := newFakeVMs(t, &state.Record{})
	for _, tc := range []struct {
		mode string
		wait time.Duration
		want string
	}{
		{egress.ModeAllow, time.Minute, "--wait is how long mode ask holds a connection; mode allow holds none"},
		{egress.ModeAsk, 500 * time.Millisecond, "--wait 500ms is not whole seconds from 1s to 600s"},
		{egress.ModeAsk, time.Hour, "--wait 1h0m0s is not whole seconds"},
	} {
		if _, err := SetMode(ctx, vms, "feat", tc.mode, tc.wait); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("net mode %s --wait %s: %v, want %q", tc.mode, tc.wait, err, tc.want)
		}
	}
	vms.placedOn = "far"
	for what, err := range map[string]error{
		"net mode ask": func() error { _, err := SetMode(ctx, vms, "feat", egress.ModeAsk, 0); return err }(),
		"net pending":  func() error { _, err := Asks(ctx, vms, "feat"); return err }(),
	} {
		if err == nil || !strings.Contains(err.Error(), "runs on host far") {
			t.Errorf("%s of a VM on another host: %v", what, err)
		}
	}
	if r, _ := state.ReadRecord(vms.e.Layout.Record()); r.Net != nil && r.Net.Mode != "" {
		t.Errorf("a refused net mode changed the record: %+v", r.Net)
	}
}
