// Package mcpproxy is `agent-vm mcp-proxy`, the MCP proxy that runs inside
// every VM: it serves named stdio MCP servers to clients on the host over
// HTTP, speaking both MCP Streamable HTTP (/servers/NAME/mcp) and the older
// HTTP+SSE transport (/servers/NAME/sse and /servers/NAME/messages).
//
// Each client session gets its own server process, and messages are relayed
// as they are, ids and all; the proxy reads only enough of each to route it.
// MCP 2026-07-28 clients, which have no sessions, are served from a pool of
// servers the proxy initializes on their behalf (pool.go, modern.go).
// Every MCP request needs the VM's bearer token, browser origins must be
// allowed explicitly, and /health reports which servers can start.
package mcpproxy

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Options configures a Proxy. Zero values mean the defaults noted.
type Options struct {
	Config Config // the servers to serve
	Token  string // the bearer token clients must present (see ReadToken)
	Addr   string // Run: the address to listen on, e.g. "0.0.0.0:8000"
	// AllowedOrigins lists the browser origins (scheme://host[:port]) allowed
	// to call the proxy. A request with any other Origin header is refused
	// with 403, which keeps web pages out via DNS rebinding; requests without
	// an Origin (every non-browser client) are not affected.
	AllowedOrigins []string
	HealthPath     string // default "/health"
	Logger         hclog.Logger
	// MaxSessions caps concurrent client sessions and pooled servers for
	// MCP 2026-07-28 clients (each is a server process); beyond it clients
	// get 503. Default 32.
	MaxSessions int
	// MaxBodyBytes caps a client's POST body (413 beyond). Default 4 MiB.
	MaxBodyBytes int64
	// MaxMessageBytes caps one message from a server; a server that sends a
	// larger one loses its session. Default 64 MiB.
	MaxMessageBytes int
	// SessionIdleTimeout ends a session (or a pooled server) that has had no
	// request and no open stream for this long. Default 30 minutes.
	SessionIdleTimeout time.Duration
	// StopGrace is how long a server gets to exit after its stdin closes and
	// then after SIGTERM (half each) before it is killed. Default 4s.
	StopGrace time.Duration
	// ShutdownTimeout bounds Run's graceful shutdown. Default 15s, inside
	// systemd's default TimeoutStopSec of 30s.
	ShutdownTimeout time.Duration
	// KeepAlive is the interval of SSE keep-alive comments. Default 25s.
	KeepAlive time.Duration
}

// Proxy serves MCP clients. Create it with New.
type Proxy struct {
	opts    Options
	log     hclog.Logger
	token   tokenMatcher
	origins map[string]bool
	servers map[string]*serverEntry
	single  *serverEntry // the server the /mcp and /sse shortcuts reach, if exactly one
	now     func() time.Time

	mu       sync.Mutex
	sessions map[string]*session
	idle     map[poolKey][]*session // pooled servers waiting for a request (pool.go)
	starting int
	closing  bool
	wg       sync.WaitGroup // session goroutines (each owns its child)
}

type serverEntry struct {
	Server
	log hclog.Logger
}

// New checks opts and returns a Proxy. It starts no servers: each starts when
// a client opens a session.
func New(opts Options) (*Proxy, error) {
	if err := checkToken(opts.Token); err != nil {
		return nil, fmt.Errorf("MCP proxy token: %w", err)
	}
	setDefaults(&opts)
	if err := checkHealthPath(opts.HealthPath); err != nil {
		return nil, err
	}
	origins, err := parseOrigins(opts.AllowedOrigins)
	if err != nil {
		return nil, err
	}
	p := &Proxy{
		opts:     opts,
		log:      opts.Logger,
		token:    newTokenMatcher(opts.Token),
		origins:  origins,
		servers:  map[string]*serverEntry{},
		now:      time.Now,
		sessions: map[string]*session{},
		idle:     map[poolKey][]*session{},
	}
	for _, sk := range opts.Config.Skipped {
		p.log.Warn("skipping config entry that is not a stdio server", "server", sk.Name, "reason", sk.Reason)
	}
	for _, srv := range opts.Config.Servers {
		if err := validName(srv.Name); err != nil {
			return nil, fmt.Errorf("server %q: %w", srv.Name, err)
		}
		if _, dup := p.servers[srv.Name]; dup {
			return nil, fmt.Errorf("server %q is configured twice", srv.Name)
		}
		e := &serverEntry{Server: srv, log: p.log.Named(srv.Name)}
		p.servers[srv.Name] = e
		if _, err := resolveCommand(srv); err != nil {
			e.log.Warn("server cannot start", "problem", err)
		}
	}
	if len(opts.Config.Servers) == 1 {
		p.single = p.servers[opts.Config.Servers[0].Name]
	}
	return p, nil
}

func setDefaults(o *Options) {
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	if o.HealthPath == "" {
		o.HealthPath = "/health"
	}
	if o.MaxSessions <= 0 {
		o.MaxSessions = 32
	}
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = 4 << 20
	}
	if o.MaxMessageBytes <= 0 {
		o.MaxMessageBytes = 64 << 20
	}
	if o.SessionIdleTimeout <= 0 {
		o.SessionIdleTimeout = 30 * time.Minute
	}
	if o.StopGrace <= 0 {
		o.StopGrace = 4 * time.Second
	}
	if o.ShutdownTimeout <= 0 {
		o.ShutdownTimeout = 15 * time.Second
	}
	if o.KeepAlive <= 0 {
		o.KeepAlive = 25 * time.Second
	}
}

func checkHealthPath(p string) error {
	if !strings.HasPrefix(p, "/") || strings.ContainsAny(p, "?# ") {
		return fmt.Errorf("health path %q must be a URL path starting with / (e.g. /health)", p)
	}
	switch {
	case p == "/mcp", p == "/sse", p == "/messages", strings.HasPrefix(p, "/servers/"), p == "/servers":
		return fmt.Errorf("health path %q collides with an MCP endpoint (hint: use /health)", p)
	}
	return nil
}

// parseOrigins normalises the allow list: scheme://host[:port], lowercase.
func parseOrigins(list []string) (map[string]bool, error) {
	out := map[string]bool{}
	for _, o := range list {
		u, err := url.Parse(o)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" ||
			(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
			return nil, fmt.Errorf("allowed origin %q must look like https://host or http://host:port (no path; \"*\" and \"null\" are not accepted)", o)
		}
		out[strings.ToLower(u.Scheme+"://"+u.Host)] = true
	}
	return out, nil
}

// queueLimit bounds what is queued for one stream or for a server's stdin.
func (p *Proxy) queueLimit() int { return 2 * p.opts.MaxMessageBytes }

var (
	errTooManySessions = errors.New("too many sessions")
	errShuttingDown    = errors.New("the MCP proxy is shutting down")
)

// newSession starts a server process for a new client session.
func (p *Proxy) newSession(e *serverEntry, kind transport) (*session, error) {
	if err := p.reserve(); err != nil {
		return nil, err
	}
	defer p.unreserve()
	path, err := resolveCommand(e.Server)
	if err != nil {
		return nil, err
	}
	id := newSessionID()
	s := &session{
		id:        id,
		kind:      kind,
		server:    e,
		proxy:     p,
		log:       e.log.With("session", id[:8]),
		stop:      make(chan struct{}),
		pending:   map[string]*call{},
		exchanges: map[*exchange]struct{}{},
		lastUsed:  p.now(),
	}
	if kind == legacySSE {
		s.general = newMailbox(p.queueLimit())
	}
	c, err := startChild(childSpec{
		server:     e.Server,
		path:       path,
		maxMessage: p.opts.MaxMessageBytes,
		inLimit:    p.queueLimit(),
		onMessage:  s.fromChild,
		log:        s.log,
	})
	if err != nil {
		return nil, fmt.Errorf("starting MCP server %q: %w", e.Name, err)
	}
	s.child = c
	s.log = s.log.With("pid", c.pid)
	p.mu.Lock()
	if p.closing {
		p.mu.Unlock()
		c.stop(p.opts.StopGrace)
		return nil, errShuttingDown
	}
	p.sessions[id] = s
	p.wg.Add(1)
	p.mu.Unlock()
	go s.run()
	s.log.Info("session started", "transport", kind.String())
	return s, nil
}

// reserve claims room for a session being started (the cap counts sessions
// starting as well as open ones); unreserve gives the claim back.
func (p *Proxy) reserve() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.closing:
		return errShuttingDown
	case len(p.sessions)+p.starting >= p.opts.MaxSessions:
		return errTooManySessions
	}
	p.starting++
	return nil
}

func (p *Proxy) unreserve() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.starting--
}

func (t transport) String() string {
	switch t {
	case legacySSE:
		return "sse"
	case modernHTTP:
		return "streamable-http-" + modernProtocolVersion
	}
	return "streamable-http"
}

// lookup finds a live session of the given server and transport.
func (p *Proxy) lookup(id string, e *serverEntry, kind transport) *session {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.sessions[id]
	if s == nil || s.server != e || s.kind != kind {
		return nil
	}
	return s
}

func (p *Proxy) forget(s *session) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sessions[s.id] == s {
		delete(p.sessions, s.id)
	}
	if s.kind == modernHTTP {
		p.forgetIdleLocked(s)
	}
}

func (p *Proxy) sessionCounts() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := map[string]int{}
	for _, s := range p.sessions {
		n[s.server.Name]++
	}
	return n
}
