package egress

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/internal/credswap"
)

// Interceptor is how a VM's proxy puts the host's secrets into the
// guest's requests without the guest ever holding one: the guest sends a
// placeholder, and for a host a secret is bound to the proxy answers the
// CONNECT itself, terminates the guest's TLS with a certificate from the
// VM's CA (which the guest trusts), connects to the real host with
// ordinary certificate verification, and passes each HTTP/1.1 request on
// after Rewrite put the secrets in place of their placeholders. Every
// other host's CONNECT stays a tunnel the proxy cannot read: a
// placeholder sent there is worth nothing, as only this proxy swaps it.
//
// Before a request goes on, the policy's request rules judge it
// (request.go): one they refuse gets the proxy's 403, which names the
// rule and the command that allows it, and ends the tunnel.
//
// Each intercepted request is a log entry of its own (kind "https"), with
// the names of the secrets put in or, refused, the reason; never a value.
type Interceptor struct {
	CA *CA
	// Bound says whether a secret is bound to host: the proxy then
	// intercepts its CONNECTs to Ports.
	Bound func(host string) bool
	// Ports are the ports whose CONNECTs are intercepted; nil is 443
	// alone (a CONNECT to github.com:22 carries SSH, not TLS).
	Ports []int
	// Rewrite puts the secrets bound to host in place of their
	// placeholders in req (its headers), and returns their names; or it
	// refuses the request (a placeholder of a secret bound to another
	// host), with an error the guest reads and the log keeps, which names
	// no value. A plain-HTTP request is refused when Rewrite put a secret
	// in: secrets travel only over TLS.
	Rewrite func(host string, req *http.Request) (names []string, err error)
	// RootCAs verify the real hosts; nil is the host's own trust store.
	RootCAs *x509.CertPool
	// Scrub, when set, takes the secrets' values out of every answer in
	// an intercepted tunnel (headers, body, trailers) before the guest
	// reads it: a server may send back what a request carried (an error
	// quoting a header, an echo endpoint). The requests then ask for
	// answers that are not compressed.
	Scrub *credswap.Scrubber
	// PushBranch is the one branch a git push through an intercepted
	// tunnel may update ("" is none), and PushRepo the path of the one
	// repository it may update on that host ("" is any): checkPush.
	PushBranch, PushRepo string
}

// handshakeTimeout bounds each TLS handshake of an intercepted tunnel.
const handshakeTimeout = 30 * time.Second

// intercepts says whether a CONNECT to e's destination is intercepted.
func (p *Proxy) intercepts(e LogEntry) bool {
	in := p.Intercept
	if in == nil || in.Bound == nil {
		return false
	}
	ports := in.Ports
	if ports == nil {
		ports = []int{443}
	}
	return slices.Contains(ports, e.Port) && in.Bound(e.Host)
}

// intercept serves an intercepted tunnel to e's host, up being the TCP
// connection to it: TLS with the guest (in, c) and with the host, then
// one request after another until either side ends.
func (p *Proxy) intercept(c net.Conn, in io.Reader, up net.Conn, e LogEntry) {
	ic := p.Intercept
	fail := func(err error) {
		e.Error = err.Error()
		p.record(e)
	}
	leaf, err := ic.CA.leaf(e.Host)
	if err != nil {
		fail(fmt.Errorf("making the certificate for %s: %w", e.Host, err))
		return
	}
	guest := tls.Server(&readerConn{Conn: c, r: in}, &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"},
		GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
			if hello.ServerName != "" && normalize(hello.ServerName) != e.Host {
				return nil, fmt.Errorf("the guest asked for %q in a tunnel to %s", hello.ServerName, e.Host)
			}
			return leaf, nil
		},
	})
	_ = c.SetDeadline(time.Now().Add(handshakeTimeout))
	if err := guest.Handshake(); err != nil {
		fail(fmt.Errorf("TLS with the guest: %w", err))
		return
	}
	_ = c.SetDeadline(time.Time{})
	host := tls.Client(up, &tls.Config{ServerName: e.Host, RootCAs: ic.RootCAs, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}})
	_ = up.SetDeadline(time.Now().Add(handshakeTimeout))
	if err := host.Handshake(); err != nil {
		fail(fmt.Errorf("TLS with %s: %w", e.Host, err))
		// The answer goes after the guest's request: an HTTP client
		// takes an answer that comes before it sent one for a broken
		// connection, and never shows it.
		_ = c.SetDeadline(time.Now().Add(handshakeTimeout))
		_, _ = http.ReadRequest(bufio.NewReader(io.LimitReader(guest, maxHeaderBytes)))
		writeStatus(guest, http.StatusBadGateway, fmt.Sprintf("agent-vm: %s could not be reached over TLS: %v\n", e.Host, err))
		return
	}
	_ = up.SetDeadline(time.Time{})
	lr := &io.LimitedReader{R: guest, N: maxHeaderBytes}
	gr, hr := bufio.NewReader(lr), bufio.NewReader(host)
	for p.exchange(guest, lr, gr, host, hr, e) {
	}
	_ = guest.Close()
	_ = host.Close()
}

// exchange passes one request from the guest to the host and the answer
// back, and says whether the connection goes on.
func (p *Proxy) exchange(guest *tls.Conn, lr *io.LimitedReader, gr *bufio.Reader, host *tls.Conn, hr *bufio.Reader, tunnel LogEntry) bool {
	lr.N = maxHeaderBytes - int64(gr.Buffered()) // the head, with what is read ahead of it
	req, err := http.ReadRequest(gr)
	if err != nil {
		if lr.N <= 0 {
			writeStatus(guest, http.StatusRequestHeaderFieldsTooLarge, "agent-vm: a request's head must fit in 1 MiB\n")
		}
		return false
	}
	lr.N = math.MaxInt64 // the body is not bounded
	e := LogEntry{Time: time.Now().UTC(), Kind: "https", Host: tunnel.Host, Port: tunnel.Port, Rule: tunnel.Rule, Request: req.Method + " " + req.URL.Path}
	if h := hostOf(req.Host); h != "" && h != tunnel.Host {
		e.Rule = fmt.Sprintf("a request for %s in a tunnel to %s", h, tunnel.Host)
		p.record(e)
		writeStatus(guest, http.StatusMisdirectedRequest, "agent-vm: "+e.Rule+"\n")
		return false
	}
	if strings.EqualFold(req.Header.Get("Expect"), "100-continue") && req.Body != http.NoBody {
		// Answered here, once the body is first read (to judge it or to
		// pass it on): the host gets it at once, and a request refused
		// before that is answered without it.
		req.Header.Del("Expect")
		req.Body = &continueBody{ReadCloser: req.Body, guest: guest}
	}
	if p.refusedByRules(guest, req, e) {
		return false
	}
	if upgrade := req.Header.Get("Upgrade"); upgrade != "" || headerHasToken(req.Header, "Connection", "upgrade") {
		// After a 101 the bytes would pass unread: neither judged nor
		// taken out of what comes back, so a server echoing them would
		// hand the guest the secret.
		e.Rule = fmt.Sprintf("an upgrade (%s) on %s, a host a secret is bound to: what follows one is not read, so no secret could be kept out of it", upgradeName(upgrade), tunnel.Host)
		p.record(e)
		writeStatus(guest, http.StatusForbidden, "agent-vm: "+e.Rule+"\n")
		return false
	}
	names, err := p.Intercept.Rewrite(tunnel.Host, req)
	if err != nil {
		e.Rule = err.Error()
		p.record(e)
		writeStatus(guest, http.StatusForbidden, "agent-vm: "+err.Error()+"\n")
		return false
	}
	if refusal, rule := p.Intercept.checkPush(req); refusal != nil {
		e.Rule, e.Secrets = rule, names
		p.record(e)
		_, _ = guest.Write(refusal)
		return false
	}
	e.Allowed, e.Secrets = true, names
	dropHopHeaders(req.Header)
	sc := p.Intercept.Scrub
	if sc != nil {
		askIdentity(req)
	}
	found := func(name string) {
		if !slices.Contains(e.Scrubbed, name) {
			e.Scrubbed = append(e.Scrubbed, name)
		}
	}
	out := &counter{w: host}
	if err := req.Write(out); err != nil {
		e.Error = "writing the request: " + err.Error()
		p.record(e)
		return false
	}
	back := &counter{w: guest}
	var resp *http.Response
	for {
		resp, err = http.ReadResponse(hr, req)
		if err != nil {
			e.Error = "reading the answer: " + err.Error()
			p.record(e)
			writeStatus(guest, http.StatusBadGateway, fmt.Sprintf("agent-vm: %s did not answer: %v\n", tunnel.Host, err))
			return false
		}
		if sc != nil {
			if err := scrubAnswer(sc, resp, found); err != nil {
				resp.Body.Close()
				e.Allowed, e.Rule = false, fmt.Sprintf("the answer of %s refused: %v", tunnel.Host, err)
				p.record(e)
				writeStatus(guest, http.StatusBadGateway, "agent-vm: "+e.Rule+"\n")
				return false
			}
		}
		if resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			break
		}
		_ = resp.Write(back) // an interim answer (103 Early Hints): the final one follows
	}
	err = resp.Write(back)
	resp.Body.Close()
	e.BytesOut, e.BytesIn = out.n, back.n
	if err != nil {
		e.Error = "writing the answer: " + err.Error()
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		// Not asked for (upgrades are refused above): the connection
		// ends rather than pass bytes unread.
		p.record(e)
		return false
	}
	p.record(e)
	return err == nil && !req.Close && !resp.Close
}

// refusedByRules applies the current policy's request rules to req, e
// being its log entry; a refused request is logged and answered, and the
// connection is to end. An unreadable policy refuses.
func (p *Proxy) refusedByRules(guest io.Writer, req *http.Request, e LogEntry) bool {
	pol, err := p.currentPolicy()
	d := RequestDecision{Rule: fmt.Sprint(err)}
	if err == nil {
		d = pol.DecideRequest(e.Host, req)
	}
	if d.Allowed {
		return false
	}
	e.Rule = d.Rule
	if d.Note != "" {
		e.Rule += "; " + d.Note
	}
	p.record(e)
	// Read what the guest sends before answering: a connection closed on
	// bytes it did not read may lose the answer. A guest that waits for
	// 100 Continue sends none.
	if cb, ok := req.Body.(*continueBody); !ok || cb.sent {
		_, _ = io.Copy(io.Discard, io.LimitReader(req.Body, maxInspectedBody))
	}
	_, _ = guest.Write(forbidden(requestDenial(req.Method+" "+e.Host+req.URL.EscapedPath(), d, pol.Branch)))
	return true
}

// requestDenial is what the guest reads when the request rules
// refuse what (its method, host and path): the rule, and the command the
// user runs on the host to allow it.
func requestDenial(what string, d RequestDecision, branch string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "agent-vm: %s refused by this VM's request rules (rule: %s).\n", what, d.Rule)
	if d.Note != "" {
		fmt.Fprintf(&b, "Before it, %s.\n", d.Note)
	}
	fmt.Fprintf(&b, "The VM's proxy reads its requests to the hosts a secret is bound to, and judges each by its request rules (`agent-vm net show %s`).\n", branch)
	if d.Fix != "" {
		fmt.Fprintf(&b, "The user can allow it on the host with: agent-vm net allow --vm %s '%s'\n", branch, d.Fix)
	}
	return b.String()
}

// hostOf is the host of a Host header, without its port, normalized.
func hostOf(hostport string) string {
	if hostport == "" {
		return ""
	}
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return normalize(h)
	}
	return normalize(hostport)
}

// errPlainSecret refuses a plain-HTTP request that would carry a secret.
var errPlainSecret = errors.New("a secret is sent over TLS only")

// checkPlain applies the Interceptor to a plain-HTTP request: a
// placeholder of a secret bound to another host is refused as over TLS,
// and one bound to this host too, since the secret would cross the
// network in the clear.
func (p *Proxy) checkPlain(host string, req *http.Request) error {
	ic := p.Intercept
	if ic == nil || ic.Rewrite == nil {
		return nil
	}
	names, err := ic.Rewrite(host, req)
	if err != nil {
		return err
	}
	if len(names) > 0 {
		return fmt.Errorf("%w: the placeholder of %s was sent to http://%s (hint: use https://)", errPlainSecret, strings.Join(names, ", "), host)
	}
	return nil
}

// continueBody is the body of a request that expects 100 Continue: its
// first read tells the guest to send it.
type continueBody struct {
	io.ReadCloser
	guest io.Writer
	sent  bool
}

func (b *continueBody) Read(p []byte) (int, error) {
	if !b.sent {
		b.sent = true
		if _, err := io.WriteString(b.guest, "HTTP/1.1 100 Continue\r\n\r\n"); err != nil {
			return 0, err
		}
	}
	return b.ReadCloser.Read(p)
}

// readerConn is a connection whose reads come from r (what the guest
// sent before the tunnel was answered, then the connection).
type readerConn struct {
	net.Conn
	r io.Reader
}

func (c *readerConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// headerHasToken says whether one of h's name headers lists token (a
// comma-separated list, any case), as Connection lists "upgrade".
func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// upgradeName is the protocol an Upgrade header asks for, for a message
// (clipped as the guest's other words are; net log escapes what it shows).
func upgradeName(upgrade string) string {
	if upgrade == "" {
		return "Connection: upgrade"
	}
	return clip(upgrade)
}
