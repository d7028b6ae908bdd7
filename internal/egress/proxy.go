package egress

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Proxy serves one VM's egress: the HTTP proxy and the exposed ports.
type Proxy struct {
	// Dir is the VM's network directory, opened once: its PolicyFile is
	// re-read when it changes.
	Dir    *os.Root
	Log    *Log
	Logger hclog.Logger
	// Hosts overrides name resolution for the names it lists (tests: an
	// allowed test name that leads to a server on the host). Its answers
	// are checked as any name's: one of the host's own or a private
	// address is reached only if the allow-list has that address itself.
	Hosts map[string]netip.Addr
	// Resolve looks a name up; nil uses the host's resolver.
	Resolve func(ctx context.Context, host string) ([]netip.Addr, error)
	// InterfaceAddrs lists the host's own addresses, read at each dial;
	// nil lists the addresses on the host's interfaces.
	InterfaceAddrs func() ([]netip.Addr, error)
	// DialTimeout bounds each outbound dial; 0 means 15 s.
	DialTimeout time.Duration
	// ExposedDir, when set, is where an exposed port is reached: the unix
	// socket ExposedDir/PORT, which agent-vm serves from the machine the user
	// exposed the port on (a VM placed on another host), rather than this
	// host's 127.0.0.1:PORT.
	ExposedDir string
	// Intercept, when set, puts the host's secrets into the guest's
	// requests to the hosts they are bound to (Interceptor).
	Intercept *Interceptor
	// dialContext connects to an address that reachable kept; nil uses a
	// net.Dialer (tests: a guard that fails a dial off this machine).
	dialContext func(ctx context.Context, network, address string) (net.Conn, error)

	asks asker // mode ask's pending asks (ask.go)

	mu     sync.Mutex
	policy Policy
	stamp  time.Time
	err    error
}

// currentPolicy is the policy file's content, re-read when its
// modification time changes.
func (p *Proxy) currentPolicy() (Policy, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fi, err := p.Dir.Stat(PolicyFile)
	if err != nil {
		return Policy{}, fmt.Errorf("%w: %v", errNoPolicy, err)
	}
	if fi.ModTime().Equal(p.stamp) && p.err == nil && !p.stamp.IsZero() {
		return p.policy, nil
	}
	p.policy, p.err = readPolicyIn(p.Dir)
	p.stamp = fi.ModTime()
	if p.err != nil {
		return Policy{}, fmt.Errorf("%w: %v", errNoPolicy, p.err)
	}
	return p.policy, nil
}

// decide applies the current policy; an unreadable policy denies.
func (p *Proxy) decide(host string) (Decision, Policy) {
	pol, err := p.currentPolicy()
	if err != nil {
		return Decision{Rule: err.Error()}, pol
	}
	return pol.Decide(host), pol
}

// maxHeaderBytes bounds a request's head (request line and headers) as
// the proxy reads it, as net/http's server does: the guest cannot make the
// proxy hold more.
const maxHeaderBytes = 1 << 20

// ServeProxy serves HTTP proxy connections from l until it is closed.
func (p *Proxy) ServeProxy(l net.Listener) error {
	return serve(l, p.handleProxy)
}

// ServeExposed serves exposed-port connections from l until it is closed: each
// starts with the relay's preamble, the host port as a decimal line.
func (p *Proxy) ServeExposed(l net.Listener) error {
	return serve(l, p.handleExposed)
}

func serve(l net.Listener, handle func(net.Conn)) error {
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		go func() {
			defer c.Close()
			handle(c)
		}()
	}
}

// handleProxy serves one guest connection: one CONNECT tunnel, or one
// plain HTTP request (answered with Connection: close).
func (p *Proxy) handleProxy(c net.Conn) {
	_ = c.SetReadDeadline(time.Now().Add(time.Minute))
	lr := &io.LimitedReader{R: c, N: maxHeaderBytes}
	br := bufio.NewReader(lr)
	req, err := http.ReadRequest(br)
	if err != nil {
		if lr.N <= 0 {
			writeStatus(c, http.StatusRequestHeaderFieldsTooLarge, "agent-vm: a request's head must fit in 1 MiB\n")
		}
		return
	}
	lr.N = math.MaxInt64 // the body is not bounded
	_ = c.SetReadDeadline(time.Time{})
	if req.Method == http.MethodConnect {
		p.connect(c, br, req)
		return
	}
	p.forward(c, br, req)
}

// target splits the destination of a request: CONNECT's authority, or an
// absolute URL's host (port 80 by default).
func target(req *http.Request) (host string, port int, err error) {
	hostport := req.Host
	defPort := "80"
	if req.Method == http.MethodConnect {
		defPort = ""
	} else if req.URL.Scheme != "http" || req.URL.Host == "" {
		return "", 0, errors.New("a proxy request needs an absolute http:// URL (https goes through CONNECT)")
	} else {
		hostport = req.URL.Host
	}
	h, ps, err := net.SplitHostPort(hostport)
	if err != nil {
		if defPort == "" {
			return "", 0, fmt.Errorf("CONNECT needs host:port, not %q", hostport)
		}
		h, ps = hostport, defPort
	}
	n, err := strconv.Atoi(ps)
	if err != nil || n < 1 || n > 65535 {
		return "", 0, fmt.Errorf("bad port in %q", hostport)
	}
	return normalize(h), n, nil
}

// begin reads the request's destination, decides on it and dials it. When
// it cannot it answers the guest (and logs a decision) and returns false.
func (p *Proxy) begin(c net.Conn, br *bufio.Reader, req *http.Request, kind string) (LogEntry, net.Conn, bool) {
	host, port, err := target(req)
	if err != nil {
		writeStatus(c, http.StatusBadRequest, "agent-vm: "+err.Error()+"\n")
		return LogEntry{}, nil, false
	}
	e := LogEntry{Time: time.Now().UTC(), Kind: kind, Host: host, Port: port}
	up, ok := p.open(c, br, req, &e)
	return e, up, ok
}

func (p *Proxy) connect(c net.Conn, br *bufio.Reader, req *http.Request) {
	e, up, ok := p.begin(c, br, req, "connect")
	if !ok {
		return
	}
	defer up.Close()
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	// What the guest sent after its request, before our answer, is part
	// of the tunnel.
	in := io.MultiReader(io.LimitReader(br, int64(br.Buffered())), c)
	if p.intercepts(e) {
		p.intercept(c, in, up, e)
		return
	}
	e.BytesOut, e.BytesIn = splice(c, in, up)
	p.record(e)
}

func (p *Proxy) forward(c net.Conn, br *bufio.Reader, req *http.Request) {
	e, up, ok := p.begin(c, br, req, "http")
	if !ok {
		return
	}
	defer up.Close()
	dropHopHeaders(req.Header)
	if err := p.checkPlain(e.Host, req); err != nil {
		e.Allowed, e.Rule = false, err.Error()
		p.record(e)
		writeStatus(c, http.StatusForbidden, "agent-vm: "+err.Error()+"\n")
		return
	}
	req.Close = true // one request per connection: the byte counts are this request's
	out := &counter{w: up}
	if err := req.Write(out); err != nil {
		e.Error = "writing the request: " + err.Error()
	}
	n, _ := io.Copy(c, up)
	e.BytesOut, e.BytesIn = out.n, n
	p.record(e)
}

// open decides on the entry's destination, asking the user in mode ask,
// and dials it. When it cannot it answers the guest, logs the entry and
// returns false: a refusal by the policy (the name, or every address it
// resolves to) is a 403 that says why and what lifts it, which clients do
// not retry; a destination that could not be reached is a 502.
func (p *Proxy) open(c net.Conn, br *bufio.Reader, req *http.Request, e *LogEntry) (net.Conn, bool) {
	d, pol := p.decide(e.Host)
	if d.Ask {
		d = p.ask(c, br, req, e, pol)
	}
	e.Allowed, e.Rule = d.Allowed, d.Rule
	if !d.Allowed {
		p.record(*e)
		writeDenied(c, *e, pol.Branch)
		return nil, false
	}
	up, err := p.dial(e, pol)
	if errors.Is(err, errAllRefused) {
		e.Allowed, e.Rule = false, RuleAddresses
		p.record(*e)
		writeDenied(c, *e, pol.Branch)
		return nil, false
	}
	if err != nil {
		e.Error = err.Error()
		p.record(*e)
		writeStatus(c, http.StatusBadGateway, fmt.Sprintf("agent-vm: %s:%d is allowed (%s) but could not be reached: %v\n", e.Host, e.Port, e.Rule, err))
		return nil, false
	}
	return up, true
}

// errAllRefused is dial's error when the proxy refuses every address of
// the destination (the entry's Refused).
var errAllRefused = errors.New("every address is refused")

// dial resolves and connects to an allowed destination, at the first of
// its addresses the proxy may reach (reachable) that answers; the
// addresses it refuses go into e.Refused.
func (p *Proxy) dial(e *LogEntry, pol Policy) (net.Conn, error) {
	timeout := p.DialTimeout
	if timeout == 0 {
		timeout = 15 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	addrs, refused, err := p.reachable(ctx, e.Host, pol)
	if err != nil {
		return nil, err
	}
	e.Refused = refused
	if len(addrs) == 0 {
		return nil, errAllRefused
	}
	dialContext := p.dialContext
	if dialContext == nil {
		dialContext = (&net.Dialer{}).DialContext
	}
	var errs []error
	for _, r := range refused {
		errs = append(errs, fmt.Errorf("%s resolves to %s, %s", e.Host, r.Addr, r.Why))
	}
	for _, a := range addrs {
		c, err := dialContext(ctx, "tcp", netip.AddrPortFrom(a, uint16(e.Port)).String())
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

// reachable resolves host and keeps the addresses the proxy may connect
// to; refused are the host's own and those not globally reachable
// (Judge), whatever gave them: a public name pointed at the host, an IP
// literal in mode open, or Hosts. An address on the allow-list itself is
// kept, and so is one a pin gives this very name (never one of the
// host's own).
func (p *Proxy) reachable(ctx context.Context, host string, pol Policy) (addrs []netip.Addr, refused []Refusal, err error) {
	all, err := p.lookup(ctx, host)
	if err != nil {
		return nil, nil, err
	}
	list := p.InterfaceAddrs
	if list == nil {
		list = interfaceAddrs
	}
	own, err := list()
	if err != nil {
		return nil, nil, fmt.Errorf("listing this host's addresses: %w", err)
	}
	for _, a := range all {
		if _, listed := match(pol.Allow, a.String()); !listed {
			if r, ok := Judge(a, own); ok && (r.Own || !pol.pinned(host, a)) {
				refused = append(refused, r)
				continue
			}
		}
		addrs = append(addrs, a)
	}
	return addrs, refused, nil
}

// lookup resolves host: an IP literal is itself, a name in Hosts is what
// Hosts says.
func (p *Proxy) lookup(ctx context.Context, host string) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{a}, nil
	}
	if a, ok := p.Hosts[host]; ok {
		return []netip.Addr{a}, nil
	}
	resolve := p.Resolve
	if resolve == nil {
		resolve = func(ctx context.Context, h string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", h)
		}
	}
	addrs, err := resolve(ctx, host)
	if err == nil && len(addrs) == 0 {
		err = fmt.Errorf("%s has no address", host)
	}
	return addrs, err
}

// handleExposed relays a connection to an exposed host port on 127.0.0.1.
func (p *Proxy) handleExposed(c net.Conn) {
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n')
	if err != nil {
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	port, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || port < 1 || port > 65535 {
		return
	}
	p.relayExposed(c, br, port)
}

// relayExposed relays a connection to host port on 127.0.0.1 when the
// policy exposes it (re-read at each connection, so a port taken away
// closes at once); br holds what the guest sent after any preamble.
func (p *Proxy) relayExposed(c net.Conn, br *bufio.Reader, port int) {
	e := LogEntry{Time: time.Now().UTC(), Kind: KindExposedPort, Host: "127.0.0.1", Port: port}
	pol, err := p.currentPolicy()
	switch {
	case err != nil:
		e.Rule = err.Error()
	case pol.Exposes(port):
		e.Allowed, e.Rule = true, "exposed"
	default:
		e.Rule = "not exposed"
	}
	if !e.Allowed {
		p.record(e)
		hangUp(c)
		return
	}
	network, addr := "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	if p.ExposedDir != "" {
		network, addr = "unix", filepath.Join(p.ExposedDir, strconv.Itoa(port))
	}
	up, err := net.DialTimeout(network, addr, 5*time.Second)
	if err != nil {
		e.Error = err.Error()
		p.record(e)
		hangUp(c)
		return
	}
	defer up.Close()
	e.BytesOut, e.BytesIn = splice(c, io.MultiReader(io.LimitReader(br, int64(br.Buffered())), c), up)
	p.record(e)
}

// hangUp ends a connection the proxy will not relay so that the guest
// reads its end, not an error: the guest sees its end at once (the write
// side shut), and what it sent meanwhile is read and dropped, for at most
// a second, before the caller closes it. A socket closed with data it has
// not read resets the connection, and the guest's read then fails
// ("connection reset by peer") rather than ends, depending on whether its
// request came in before the refusal.
func hangUp(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	_, _ = io.Copy(io.Discard, c)
}

func (p *Proxy) record(e LogEntry) {
	if p.Log == nil {
		return
	}
	if err := p.Log.Add(e); err != nil && p.Logger != nil {
		p.Logger.Warn("could not log a connection", "error", err)
	}
}

// splice copies both ways until both directions end, and returns the
// bytes sent from the guest (read from in) and back to it.
func splice(guest net.Conn, in io.Reader, up net.Conn) (out, back int64) {
	var wg sync.WaitGroup
	var sent atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		n, _ := io.Copy(up, in)
		sent.Store(n)
		closeWrite(up)
	}()
	back, _ = io.Copy(guest, up)
	closeWrite(guest)
	wg.Wait()
	return sent.Load(), back
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	_ = c.Close()
}

// counter counts what passes to w.
type counter struct {
	w io.Writer
	n int64
}

func (c *counter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}

// DenialMessage is what a denied guest reads: which rule refused what, and
// the command the user runs on the host to allow it (Fix).
func DenialMessage(e LogEntry, branch string) string {
	if e.Rule == RuleAddresses {
		return fmt.Sprintf("agent-vm: connection to %s:%d refused by this VM's network policy: the name is allowed, but %s.\n"+
			"This VM reaches the network only through agent-vm's proxy, which does not connect to this host's own addresses or to addresses that are not globally reachable.\n"+
			"The user can allow it on the host with: %s\n", e.Host, e.Port, RefusedAddrs(e), Fix(e, branch))
	}
	return fmt.Sprintf("agent-vm: connection to %s:%d denied by this VM's network policy (rule: %s).\n"+
		"This VM reaches the network only through agent-vm's proxy, which allows listed destinations.\n"+
		"The user can allow it on the host with: %s\n", e.Host, e.Port, e.Rule, Fix(e, branch))
}

// RefusedAddrs says why the proxy refused the addresses of a
// RuleAddresses entry: "NAME resolves to ADDR, WHY; and to ...".
func RefusedAddrs(e LogEntry) string {
	parts := make([]string, 0, len(e.Refused))
	for _, r := range e.Refused {
		parts = append(parts, fmt.Sprintf("to %s, %s", r.Addr, r.Why))
	}
	return e.Host + " resolves " + strings.Join(parts, "; and ")
}

// Fix is the command (or commands) the user runs on the host to lift the
// refusal e of branch's VM: `net allow` of the name, of the rule's
// pattern for a `net deny`, `net mode` for an offline VM; for refused
// addresses, `agent-vm setup` when the name is a package source (it pins
// the name's address on this network) and `net allow` of the addresses
// (which lets the VM reach them under any allowed name).
func Fix(e LogEntry, branch string) string {
	fix := fmt.Sprintf("agent-vm net allow --vm %s %s", branch, e.Host)
	switch {
	case e.Rule == RuleAddresses:
		return addressFix(e, branch)
	case e.Rule == ruleOffline:
		fix = fmt.Sprintf("agent-vm net mode --vm %s allow (this VM is offline), and %s if the name is not on the default allow-list", branch, fix)
	case strings.HasPrefix(e.Rule, ruleDeny):
		fix = fmt.Sprintf("agent-vm net allow --vm %s %s (the refusal that matched)", branch, strings.TrimPrefix(e.Rule, ruleDeny))
	}
	return fix
}

// addressFix is Fix for refused addresses.
func addressFix(e LogEntry, branch string) string {
	var other, own []string
	for _, r := range e.Refused {
		a := r.Addr.Unmap().String()
		switch {
		case r.Own && !slices.Contains(own, a):
			own = append(own, a)
		case !r.Own && !slices.Contains(other, a):
			other = append(other, a)
		}
	}
	var fixes []string
	if len(other) > 0 {
		if slices.Contains(PackageSources, e.Host) {
			fixes = append(fixes, fmt.Sprintf("agent-vm setup (it pins %s to the address this host's resolver gives it, for every VM and for that name alone)", e.Host))
		}
		fixes = append(fixes, fmt.Sprintf("agent-vm net allow --vm %s %s (this VM then reaches that address under any name it may reach)", branch, strings.Join(other, " ")))
	}
	if len(own) > 0 {
		fixes = append(fixes, fmt.Sprintf("agent-vm net allow --vm %s %s (an address of this host: the VM then reaches the host's own services there)", branch, strings.Join(own, " ")))
	}
	return strings.Join(fixes, ", or ")
}

func writeDenied(c net.Conn, e LogEntry, branch string) {
	_, _ = c.Write(forbidden(DenialMessage(e, branch)))
}

// forbidden is the proxy's refusal with the message msg, whose first line
// is also its X-Agent-VM-Denied header, closing the connection.
func forbidden(msg string) []byte {
	return fmt.Appendf(nil, "HTTP/1.1 403 Forbidden by agent-vm\r\nContent-Type: text/plain; charset=utf-8\r\nX-Agent-VM-Denied: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		strings.ReplaceAll(strings.TrimSpace(strings.SplitN(msg, "\n", 2)[0]), "\r", ""), len(msg), msg)
}

func writeStatus(c net.Conn, code int, body string) { _, _ = c.Write(statusBytes(code, body)) }

// statusBytes is the proxy's own answer with code and a plain-text body,
// closing the connection.
func statusBytes(code int, body string) []byte {
	return fmt.Appendf(nil, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		code, http.StatusText(code), len(body), body)
}

// dropHopHeaders removes what was meant for the proxy, not the destination.
func dropHopHeaders(h http.Header) {
	for _, name := range []string{"Proxy-Connection", "Proxy-Authorization", "Keep-Alive"} {
		h.Del(name)
	}
}
