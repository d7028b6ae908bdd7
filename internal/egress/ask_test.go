package egress

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// askPolicy is mode ask over a fixture whose test names lead to the
// loopback (allowed itself, as any name's address must be).
func askPolicy(wait int) Policy {
	return Policy{Branch: "feat", Mode: ModeAsk, Allow: []string{"allowed.test", "127.0.0.1"}, Deny: []string{"denied.test"}, AskWait: wait}
}

// pendingAsks waits for n asks in the fixture's AsksFile.
func (f *fixture) pendingAsks(n int) []Ask {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var asks []Ask
	if err := tu.Poll(ctx, fmt.Sprintf("%d pending asks", n), func() bool {
		var err error
		if asks, err = ReadAsks(f.dir); err != nil {
			f.t.Fatal(err)
		}
		return len(asks) == n
	}); err != nil {
		f.t.Fatalf("%v; pending: %+v", err, asks)
	}
	return asks
}

func (f *fixture) answer(as ...Answer) {
	f.t.Helper()
	if err := WriteAnswers(f.dir, as); err != nil {
		f.t.Fatal(err)
	}
}

// getLater fetches u through the proxy in the background.
func (f *fixture) getLater(u string) <-chan string {
	got := make(chan string, 1)
	go func() {
		resp, err := f.client().Get(u)
		if err != nil {
			got <- err.Error()
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		got <- fmt.Sprintf("%d %s", resp.StatusCode, body)
	}()
	return got
}

func hello(t *testing.T) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "hello %s", r.URL.Path) }))
	t.Cleanup(srv.Close)
	return port(t, srv.URL)
}

// An unlisted name is held, shown with its request, and goes through once
// approved; an answer naming another proxy's ask (its token) does nothing.
func TestAskApproved(t *testing.T) {
	p := hello(t)
	f := newFixture(t, askPolicy(0))
	got := f.getLater("http://asked.test:" + p + "/x?q=secret")
	asks := f.pendingAsks(1)
	a := asks[0]
	if a.ID != 1 || a.Host != "asked.test" || a.Port != atoi(t, p) || a.Method != "GET" || a.Path != "/x" || a.Kind != "http" ||
		a.Token == "" || a.Until.Sub(a.Time) != DefaultAskWait*time.Second {
		t.Fatalf("ask = %+v", a)
	}
	f.answer(Answer{ID: 1, Token: "0123456789abcdef", Allow: true})
	select {
	case s := <-got:
		t.Fatalf("an answer with another token let the request through: %s", s)
	case <-time.After(3 * askPoll):
	}
	f.answer(Answer{ID: 1, Token: a.Token, Allow: true})
	if s := <-got; s != "200 hello /x" {
		t.Fatalf("approved request: %s", s)
	}
	es := f.entries(1)
	if len(es) != 1 || !es[0].Allowed || es[0].Ask != 1 || es[0].Rule != "approved by the user, this once (ask 1)" {
		t.Fatalf("log = %+v", es)
	}
	f.pendingAsks(0)
}

// Refused by the user, unanswered within AskWait, or pushed out by a flood:
// each a 403 whose rule says which, logged with the ask.
func TestAskRefusals(t *testing.T) {
	p := hello(t)
	f := newFixture(t, askPolicy(2))
	got := f.getLater("https://asked.test:" + p + "/")
	a := f.pendingAsks(1)[0]
	if a.Method != "CONNECT" || a.Path != "" || a.Kind != "connect" {
		t.Fatalf("ask = %+v", a)
	}
	f.answer(Answer{ID: a.ID, Token: a.Token, Always: true})
	if s := <-got; !strings.Contains(s, "Forbidden by agent-vm") {
		t.Fatalf("refused CONNECT: %s", s)
	}
	if s := <-f.getLater("http://asked.test:" + p + "/late"); !strings.Contains(s, "403") || !strings.Contains(s, "no answer within 2 s (ask 2)") ||
		!strings.Contains(s, "agent-vm net allow --vm feat asked.test") {
		t.Fatalf("unanswered: %s", s)
	}
	es := f.entries(2)
	if es[0].Allowed || es[0].Ask != 1 || es[0].Rule != "refused by the user, and denied from now on (ask 1)" ||
		es[1].Allowed || es[1].Ask != 2 {
		t.Fatalf("log = %+v", es)
	}

	// MaxAsks+1 held at once: the oldest is refused, the others wait.
	f.setPolicy(askPolicy(60))
	var gots []<-chan string
	for i := range MaxAsks + 1 {
		gots = append(gots, f.getLater(fmt.Sprintf("http://asked.test:%s/%d", p, i)))
		if i < MaxAsks {
			f.pendingAsks(i + 1) // in order: the first is the oldest
		}
	}
	if s := <-gots[0]; !strings.Contains(s, fmt.Sprintf("more than %d asks were pending", MaxAsks)) {
		t.Fatalf("the oldest of a flood: %s", s)
	}
	asks := f.pendingAsks(MaxAsks)
	if asks[0].Path != "/1" {
		t.Fatalf("pending after the flood begin with %+v", asks[0])
	}
	// The policy comes to allow the name: every held request goes through.
	pol := askPolicy(60)
	pol.Allow = append(pol.Allow, "asked.test")
	f.setPolicy(pol)
	for i, g := range gots[1:] {
		if s := <-g; s != fmt.Sprintf("200 hello /%d", i+1) {
			t.Fatalf("request %d once its name was allowed: %s", i+1, s)
		}
	}
	es = f.entries(2 + MaxAsks + 1)
	if r := es[len(es)-1].Rule; !strings.Contains(r, "allow asked.test (ask ") || !strings.Contains(r, "the policy changed while asking") {
		t.Fatalf("rule of a request let through by net allow: %q", r)
	}
}

// A deny rule and mode offline refuse at once: only an unlisted name is
// asked about. The guest closing a held connection ends its ask.
func TestAskOnlyForUnlisted(t *testing.T) {
	f := newFixture(t, askPolicy(0))
	if s := <-f.getLater("http://denied.test:81/"); !strings.Contains(s, "rule: deny denied.test") {
		t.Fatalf("a denied name in mode ask: %s", s)
	}
	pol := askPolicy(0)
	pol.Mode = ModeOffline
	f.setPolicy(pol)
	if s := <-f.getLater("http://other.test:81/"); !strings.Contains(s, "rule: mode offline") {
		t.Fatalf("mode offline: %s", s)
	}
	f.pendingAsks(0)

	f.setPolicy(askPolicy(0))
	c, err := net.Dial("tcp", f.url.Host)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "CONNECT other.test:443 HTTP/1.1\r\nHost: other.test:443\r\n\r\n")
	f.pendingAsks(1)
	c.Close()
	f.pendingAsks(0)
	es := f.entries(3)
	if last := es[len(es)-1]; last.Allowed || last.Rule != "the guest closed the connection before an answer (ask 1)" {
		t.Fatalf("log = %+v", es)
	}
}

// What the guest sends after CONNECT while the ask holds it is the
// tunnel's first bytes, once approved.
func TestAskKeepsEarlyBytes(t *testing.T) {
	p := echoServer(t)
	f := newFixture(t, askPolicy(0))
	c, err := net.Dial("tcp", f.url.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "CONNECT asked.test:%s HTTP/1.1\r\nHost: asked.test:%s\r\n\r\n", p, p)
	a := f.pendingAsks(1)[0]
	io.WriteString(c, "early")
	time.Sleep(2 * askPoll) // the bytes reach the proxy while it holds them
	f.answer(Answer{ID: a.ID, Token: a.Token, Allow: true, Always: true})
	wantEarlyEcho(t, c)
	if es := f.entries(1); len(es) != 1 || es[0].BytesOut != 5 || es[0].Rule != "approved by the user, and allowed from now on (ask 1)" {
		t.Fatalf("log = %+v", es)
	}
}

func atoi(t *testing.T, s string) int {
	var n int
	if _, err := fmt.Sscan(s, &n); err != nil {
		t.Fatal(err)
	}
	return n
}
