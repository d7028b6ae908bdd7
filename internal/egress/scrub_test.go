package egress

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"crypto/tls"

	"github.com/agent-vm/agent-vm/internal/credswap"
)

const (
	echoPH  = "agent-vm-placeholder-0123456789abcdef0123456789abcdef"
	echoVal = "ghp_REALtokenVALUE0000000000000000000000"
)

// echoUpstream answers every request with its Authorization header sent
// back as a bound host may: in a response header, in a 400 body that
// quotes it as JSON, plain (Content-Length), chunked with the value split
// across two chunks, gzip-compressed although the request asked for
// identity, in a trailer, or with an encoding the proxy cannot read. It
// records the Accept-Encoding each request had.
func echoUpstream(t *testing.T, accepted *[]string) (*CA, int) {
	t.Helper()
	ca := testCA(t, "upstream")
	port := serveTLS(t, ca, "allowed.test", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		*accepted = append(*accepted, r.Header.Get("Accept-Encoding"))
		auth := r.Header.Get("Authorization")
		w.Header().Set("X-Echo", auth)
		switch r.URL.Path {
		case "/plain":
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprintf(w, `{"message":"bad header value %q","basic":%q}`, auth, base64.StdEncoding.EncodeToString([]byte("x-access-token:"+strings.TrimPrefix(auth, "Bearer "))))
		case "/chunked":
			half := len(auth) / 2
			io.WriteString(w, "first half: "+auth[:half])
			w.(http.Flusher).Flush()
			time.Sleep(50 * time.Millisecond) // the two halves in two reads: the split is what is tested
			io.WriteString(w, auth[half:]+" :second half")
		case "/gzip":
			w.Header().Set("Content-Encoding", "gzip")
			gz := gzip.NewWriter(w)
			io.WriteString(gz, "compressed: "+auth)
			gz.Close()
		case "/trailer":
			w.Header().Set("Trailer", "X-Echo-Trailer")
			io.WriteString(w, "body")
			w.Header().Set("X-Echo-Trailer", auth)
		case "/br":
			w.Header().Set("Content-Encoding", "br")
			io.WriteString(w, "not really brotli: "+auth)
		}
	}))
	return ca, port
}

// echoFixture is a proxy that intercepts echoUpstream as allowed.test
// with GH_TOKEN bound to it (NewInterceptor: swap and scrub), a client
// that trusts the VM's CA alone and asks for no compression of its own,
// and the upstream's base URL.
func echoFixture(t *testing.T, accepted *[]string) (*fixture, *http.Client, string) {
	t.Helper()
	upCA, port := echoUpstream(t, accepted)
	set, err := credswap.New([]credswap.Secret{{Name: "GH_TOKEN", Placeholder: echoPH, Value: echoVal, Hosts: []string{"allowed.test"}}})
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, Policy{Branch: "feat", Mode: ModeAllow, Allow: []string{"allowed.test", "127.0.0.1"}})
	vmCA := testCA(t, "feat")
	ic := NewInterceptor(vmCA, set, "feat", "")
	ic.Ports, ic.RootCAs = []int{port}, pool(upCA)
	f.p.Intercept = ic
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(f.url),
		DisableCompression: true, TLSClientConfig: &tls.Config{RootCAs: pool(vmCA)}}}
	return f, c, "https://allowed.test:" + strconv.Itoa(port)
}

// A bound host that sends back what the request carried gives the guest
// the placeholder, never the value: in headers, bodies (JSON, plain,
// split across chunks, gzip decoded), trailers and an echoed Basic
// credential; each answer scrubbed is logged with the secret's name; an
// answer in an encoding the proxy cannot read is refused.
func TestInterceptScrubsTheAnswer(t *testing.T) {
	var accepted []string
	f, c, base := echoFixture(t, &accepted)
	get := func(path string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", base+path, nil)
		req.Header.Set("Authorization", "Bearer "+echoPH)
		req.Header.Set("Accept-Encoding", "gzip, br")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	for _, path := range []string{"/plain", "/chunked", "/gzip", "/trailer"} {
		resp, body := get(path)
		all := fmt.Sprint(resp.Header, resp.Trailer) + body
		if strings.Contains(all, echoVal) || strings.Contains(all, base64.StdEncoding.EncodeToString([]byte(echoVal))[:20]) {
			t.Errorf("%s: the guest read the value: %s", path, all)
		}
		if resp.Header.Get("X-Echo") != "Bearer "+echoPH {
			t.Errorf("%s: X-Echo %q, want the placeholder", path, resp.Header.Get("X-Echo"))
		}
		want := map[string]string{"/plain": `bad header value "Bearer ` + echoPH, "/chunked": "first half: Bearer " + echoPH + " :second half",
			"/gzip": "compressed: Bearer " + echoPH, "/trailer": "body"}[path]
		if !strings.Contains(body, want) {
			t.Errorf("%s: body %q, want it to hold %q", path, body, want)
		}
		if path == "/trailer" && resp.Trailer.Get("X-Echo-Trailer") != "Bearer "+echoPH {
			t.Errorf("/trailer: trailer %q, want the placeholder", resp.Trailer.Get("X-Echo-Trailer"))
		}
		if path == "/plain" {
			basic := body[strings.LastIndex(body, `"basic":"`)+9 : len(body)-2]
			if dec, _ := base64.StdEncoding.DecodeString(basic); bytes.Contains(dec, []byte(echoVal)) {
				t.Errorf("the echoed Basic credential decodes to the value: %q", dec)
			}
		}
	}
	resp, body := get("/br")
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, "Content-Encoding br, which the proxy cannot read") || strings.Contains(body, echoVal) {
		t.Errorf("an answer in br: %d %q, want 502 saying the proxy cannot read it", resp.StatusCode, body)
	}
	for i, a := range accepted {
		if a != "identity" {
			t.Errorf("request %d reached the host with Accept-Encoding %q, want identity", i, a)
		}
	}
	es := f.entries(5)
	for _, e := range es[:4] {
		if fmt.Sprint(e.Scrubbed) != "[GH_TOKEN]" || fmt.Sprint(e.Secrets) != "[GH_TOKEN]" {
			t.Errorf("entry %+v: want GH_TOKEN put in and scrubbed", e)
		}
	}
	if e := es[4]; e.Allowed || !strings.Contains(e.Rule, "cannot read") {
		t.Errorf("entry %+v: want the br answer refused", e)
	}
	if strings.Contains(fmt.Sprint(es), echoVal) {
		t.Errorf("the log holds the value: %+v", es)
	}
}

// An upgrade (a WebSocket) on a host a secret is bound to is refused
// before it leaves: what follows a 101 would pass unread, echoes and all.
func TestInterceptRefusesUpgrades(t *testing.T) {
	var accepted []string
	f, c, base := echoFixture(t, &accepted)
	for _, hdr := range []map[string]string{{"Upgrade": "websocket", "Connection": "Upgrade"}, {"Connection": "keep-alive, UPGRADE"}} {
		req, _ := http.NewRequest("GET", base+"/plain", nil)
		req.Header.Set("Authorization", "Bearer "+echoPH)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(b), "what follows one is not read") {
			t.Errorf("an upgrade (%v): %d %q, want 403 saying why", hdr, resp.StatusCode, b)
		}
	}
	if len(accepted) != 0 {
		t.Errorf("the host got %d requests, want none", len(accepted))
	}
	for _, e := range f.entries(2) {
		if e.Allowed || !strings.Contains(e.Rule, "an upgrade") {
			t.Errorf("entry %+v: want the upgrade refused", e)
		}
	}
}
