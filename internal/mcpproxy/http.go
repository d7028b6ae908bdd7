package mcpproxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"
)

// Header names, as the MCP specification writes them.
const (
	hdrSessionID       = "Mcp-Session-Id"
	hdrProtocolVersion = "MCP-Protocol-Version"
)

// bodyReadTimeout bounds reading one POST body.
const bodyReadTimeout = 30 * time.Second

// modernProtocolVersion is the MCP revision without initialize and sessions
// (see modern.go).
const modernProtocolVersion = "2026-07-28"

// protocolVersions are the MCP revisions the proxy speaks, newest first: the
// modern one, then the initialize-based ones.
var protocolVersions = []string{modernProtocolVersion, "2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05", "2024-10-07"}

// supportedProtocolVersion reports whether the proxy speaks the transport of
// an MCP protocol revision (the MCP-Protocol-Version header).
func supportedProtocolVersion(v string) bool { return slices.Contains(protocolVersions, v) }

// unsupportedVersion answers a request for a revision the proxy does not
// speak with the 2026-07-28 UnsupportedProtocolVersionError, which lists the
// supported ones (a modern client retries with one of them).
func unsupportedVersion(w http.ResponseWriter, id json.RawMessage, v string) {
	msg := fmt.Sprintf("unsupported %s %q (this proxy speaks %s and the initialize-based revisions 2024-11-05 to 2025-11-25)", hdrProtocolVersion, v, modernProtocolVersion)
	data := map[string]any{"supported": protocolVersions, "requested": v}
	writeRPCErrorData(w, http.StatusBadRequest, id, codeUnsupportedVersion, msg, data)
}

// endpoint is what a URL path asks for.
type endpoint int

const (
	epStreamable endpoint = iota + 1 // .../mcp
	epSSE                            // .../sse
	epMessages                       // .../messages
)

// Handler returns the proxy's HTTP handler: the MCP endpoints and /health.
func (p *Proxy) Handler() http.Handler { return http.HandlerFunc(p.serveHTTP) }

func (p *Proxy) serveHTTP(w http.ResponseWriter, r *http.Request) {
	origin := r.Header.Get("Origin")
	if origin != "" && !p.origins[strings.ToLower(origin)] {
		p.log.Warn("refused a request from a browser origin that is not allowed", "origin", origin, "path", r.URL.Path)
		httpError(w, http.StatusForbidden, fmt.Sprintf("origin %q is not allowed (hint: add it with --allow-origin)", origin))
		return
	}
	if origin != "" {
		h := w.Header()
		h.Set("Access-Control-Allow-Origin", origin)
		h.Add("Vary", "Origin")
		h.Set("Access-Control-Expose-Headers", hdrSessionID+", "+hdrProtocolVersion+", WWW-Authenticate")
	}
	if r.URL.Path == p.opts.HealthPath {
		p.serveHealth(w, r)
		return
	}
	name, ep, ok := splitPath(r.URL.Path)
	if !ok {
		httpError(w, http.StatusNotFound, "not found: the MCP endpoints are /servers/NAME/mcp (Streamable HTTP) and /servers/NAME/sse (HTTP+SSE); "+p.opts.HealthPath+" lists the servers")
		return
	}
	if r.Method == http.MethodOptions {
		p.preflight(w, r)
		return
	}
	if !p.token.matchAuthorization(r.Header.Get("Authorization")) {
		p.unauthorized(w, r)
		return
	}
	v := r.Header.Get(hdrProtocolVersion)
	if v != "" && !supportedProtocolVersion(v) {
		unsupportedVersion(w, nil, v)
		return
	}
	e, msg := p.server(name)
	if e == nil {
		httpError(w, http.StatusNotFound, msg)
		return
	}
	switch {
	case v == modernProtocolVersion && ep != epStreamable:
		httpError(w, http.StatusBadRequest, "MCP "+modernProtocolVersion+" is served on the Streamable HTTP endpoint /servers/NAME/mcp, not on the HTTP+SSE one")
		return
	case v == modernProtocolVersion:
		p.serveModern(w, r, e)
		return
	}
	switch ep {
	case epStreamable:
		p.serveStreamable(w, r, e)
	case epSSE:
		p.serveSSE(w, r, e)
	case epMessages:
		p.serveMessages(w, r, e)
	}
}

// splitPath parses /servers/NAME/{mcp,sse,messages} and the shortcuts
// /mcp, /sse and /messages (name "").
func splitPath(path string) (name string, ep endpoint, ok bool) {
	rest := path
	if r, found := strings.CutPrefix(path, "/servers/"); found {
		n, tail, found := strings.Cut(r, "/")
		if !found || n == "" {
			return "", 0, false
		}
		name, rest = n, "/"+tail
	}
	switch rest {
	case "/mcp":
		return name, epStreamable, true
	case "/sse":
		return name, epSSE, true
	case "/messages":
		return name, epMessages, true
	}
	return "", 0, false
}

// server resolves a server name ("" for the shortcuts).
func (p *Proxy) server(name string) (*serverEntry, string) {
	if name == "" {
		if p.single != nil {
			return p.single, ""
		}
		return nil, fmt.Sprintf("this proxy serves %d MCP servers, so /mcp and /sse need a name: use /servers/NAME/mcp (servers: %s)", len(p.servers), p.serverNames())
	}
	if e := p.servers[name]; e != nil {
		return e, ""
	}
	return nil, fmt.Sprintf("no MCP server named %q (servers: %s)", name, p.serverNames())
}

func (p *Proxy) serverNames() string {
	if len(p.servers) == 0 {
		return "none configured"
	}
	names := make([]string, 0, len(p.servers))
	for n := range p.servers {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

func (p *Proxy) preflight(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Allow", "GET, POST, DELETE, OPTIONS")
	if r.Header.Get("Origin") != "" { // allowed, or serveHTTP would have refused it
		h.Set("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS")
		h.Set("Access-Control-Allow-Headers", "Authorization, Content-Type, Accept, Last-Event-ID, "+hdrSessionID+", "+hdrProtocolVersion)
		h.Set("Access-Control-Max-Age", "600")
	}
	w.WriteHeader(http.StatusNoContent)
}

func (p *Proxy) unauthorized(w http.ResponseWriter, r *http.Request) {
	challenge := `Bearer realm="agent-vm mcp-proxy"`
	msg := "missing bearer token (hint: send the header `Authorization: Bearer TOKEN`; `agent-vm mcp-config BRANCH` prints a client config that does)"
	if r.Header.Get("Authorization") != "" {
		challenge += `, error="invalid_token"`
		msg = "wrong bearer token (hint: `agent-vm mcp-config BRANCH` prints the current one)"
	}
	p.log.Warn("refused a request without a valid token", "path", r.URL.Path, "remote", r.RemoteAddr)
	w.Header().Set("WWW-Authenticate", challenge)
	httpError(w, http.StatusUnauthorized, msg)
}

// httpError answers with a status and, as the MCP spec allows, a JSON-RPC
// error response without an id.
func httpError(w http.ResponseWriter, status int, msg string) {
	code := codeConnectionClosed // the SDKs' generic server error
	switch status {
	case http.StatusBadRequest:
		code = codeInvalidRequest
	case http.StatusInternalServerError:
		code = codeInternalError
	}
	writeRPCError(w, status, nil, code, msg)
}

func writeRPCError(w http.ResponseWriter, status int, id json.RawMessage, code int, msg string) {
	writeRPCErrorData(w, status, id, code, msg, nil)
}

func writeRPCErrorData(w http.ResponseWriter, status int, id json.RawMessage, code int, msg string, data any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(rpcErrorData(id, code, msg, data), '\n'))
}

// readBody reads a POST body within the size limit and answers the error
// itself when it fails.
func (p *Proxy) readBody(w http.ResponseWriter, r *http.Request) ([]message, bool, bool) {
	if ct := r.Header.Get("Content-Type"); !isJSONContentType(ct) {
		httpError(w, http.StatusUnsupportedMediaType, fmt.Sprintf("Content-Type must be application/json, not %q", ct))
		return nil, false, false
	}
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(bodyReadTimeout))
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, p.opts.MaxBodyBytes))
	_ = rc.SetReadDeadline(time.Time{}) // a deadline left set would cancel long responses
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			httpError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body is larger than %d bytes (hint: the proxy's --max-body limit)", tooBig.Limit))
		} else {
			httpError(w, http.StatusBadRequest, "reading request body: "+err.Error())
		}
		return nil, false, false
	}
	msgs, batch, err := parseBody(body)
	if err != nil {
		code := codeInvalidRequest
		if errors.Is(err, errNotJSON) {
			code = codeParseError
		}
		writeRPCError(w, http.StatusBadRequest, nil, code, "invalid JSON-RPC: "+err.Error())
		return nil, false, false
	}
	return msgs, batch, true
}

func isJSONContentType(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == "application/json"
}

// accepts reports which response types the Accept header allows. No header
// allows both.
func accepts(r *http.Request) (jsonOK, sseOK bool) {
	values := r.Header.Values("Accept")
	if len(values) == 0 {
		return true, true
	}
	for _, v := range values {
		for _, part := range strings.Split(v, ",") {
			mt, params, err := mime.ParseMediaType(strings.TrimSpace(part))
			if err != nil || params["q"] == "0" || params["q"] == "0.0" {
				continue
			}
			switch mt {
			case "*/*":
				jsonOK, sseOK = true, true
			case "application/*", "application/json":
				jsonOK = true
			case "text/*", "text/event-stream":
				sseOK = true
			}
		}
	}
	return jsonOK, sseOK
}

func requests(msgs []message) []message {
	var reqs []message
	for _, m := range msgs {
		if m.kind == kindRequest {
			reqs = append(reqs, m)
		}
	}
	return reqs
}

// sessionError answers a failure to open or use a session.
func (p *Proxy) sessionError(w http.ResponseWriter, e *serverEntry, id json.RawMessage, err error) {
	switch {
	case errors.Is(err, errTooManySessions):
		w.Header().Set("Retry-After", "10")
		writeRPCError(w, http.StatusServiceUnavailable, id, codeConnectionClosed,
			fmt.Sprintf("too many MCP sessions open (%d) (hint: close clients you no longer use; sessions idle for %s expire)", p.opts.MaxSessions, p.opts.SessionIdleTimeout))
	case errors.Is(err, errShuttingDown):
		writeRPCError(w, http.StatusServiceUnavailable, id, codeConnectionClosed, err.Error())
	case errors.Is(err, errSessionGone):
		writeRPCError(w, http.StatusNotFound, id, codeConnectionClosed, err.Error()+" (hint: start a new session with initialize)")
	case errors.Is(err, errServerStalled):
		writeRPCError(w, http.StatusServiceUnavailable, id, codeConnectionClosed, fmt.Sprintf("MCP server %q is not reading its input; try again later or start a new session", e.Name))
	case errors.Is(err, errDuplicateID):
		writeRPCError(w, http.StatusBadRequest, id, codeInvalidRequest, err.Error())
	default:
		e.log.Error("cannot start server", "error", err)
		writeRPCError(w, http.StatusBadGateway, id, codeInternalError, err.Error())
	}
}
