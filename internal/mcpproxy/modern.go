package mcpproxy

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// MCP 2026-07-28 over Streamable HTTP: every POST carries one request (or a
// notification), its protocol version, client identity and capabilities in
// params._meta["io.modelcontextprotocol/..."], and the headers
// MCP-Protocol-Version, Mcp-Method and (tools/call, resources/read,
// prompts/get) Mcp-Name mirroring the body. There is no initialize, no
// Mcp-Session-Id, no GET stream and no DELETE; closing the response stream
// cancels the request. The proxy serves such a request from a pooled server
// it initialized itself (pool.go) and answers server/discover itself from
// that server's initialize result. The request is relayed as it is, _meta
// included: an initialize-based server ignores _meta keys it does not know.

// Header names of 2026-07-28 and the _meta keys they mirror.
const (
	hdrMethod          = "Mcp-Method"
	hdrName            = "Mcp-Name"
	metaVersion        = "io.modelcontextprotocol/protocolVersion"
	metaServerInfo     = "io.modelcontextprotocol/serverInfo"
	base64HeaderPrefix = "=?base64?"
	base64HeaderSuffix = "?="
)

var errHeaderMismatch = errors.New("header mismatch")

// modernParams is what the proxy reads of a 2026-07-28 request's params.
type modernParams struct {
	Name string `json:"name"`
	URI  string `json:"uri"`
	Meta struct {
		Version      string          `json:"io.modelcontextprotocol/protocolVersion"`
		ClientInfo   json.RawMessage `json:"io.modelcontextprotocol/clientInfo"`
		Capabilities json.RawMessage `json:"io.modelcontextprotocol/clientCapabilities"`
	} `json:"_meta"`
}

func (p *Proxy) serveModern(w http.ResponseWriter, r *http.Request, e *serverEntry) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST, OPTIONS")
		httpError(w, http.StatusMethodNotAllowed, "method not allowed: MCP "+modernProtocolVersion+" has no GET stream and no sessions to DELETE; send each request as a POST")
		return
	}
	msgs, batch, jsonOK, sseOK, ok := p.readPost(w, r)
	if !ok {
		return
	}
	m := msgs[0]
	switch {
	case batch:
		httpError(w, http.StatusBadRequest, "MCP "+modernProtocolVersion+" sends one message per POST, not a batch")
		return
	case m.kind == kindResponse:
		httpError(w, http.StatusBadRequest, "MCP "+modernProtocolVersion+" clients send no responses: no server request is waiting for one")
		return
	case m.kind == kindNotification: // it relates to no request, so no server can use it
		w.WriteHeader(http.StatusAccepted)
		return
	}
	var params modernParams
	if err := readModernParams(m.raw, &params); err != nil {
		writeRPCError(w, http.StatusBadRequest, m.rawID, codeInvalidRequest, err.Error())
		return
	}
	if err := checkModernHeaders(r.Header, m.method, params); err != nil {
		writeRPCError(w, http.StatusBadRequest, m.rawID, codeHeaderMismatch, err.Error())
		return
	}
	if m.method == "initialize" {
		writeRPCError(w, http.StatusBadRequest, m.rawID, codeInvalidRequest, "initialize belongs to the revisions before "+modernProtocolVersion+"; send it without "+hdrProtocolVersion+": "+modernProtocolVersion+" and _meta, or use server/discover")
		return
	}
	key := newPoolKey(e.Name, params.Meta.Version, params.Meta.ClientInfo, params.Meta.Capabilities)
	s, ex, err := p.startModernRequest(r, e, key, params.Meta.ClientInfo, m, sseOK)
	if err != nil {
		p.sessionError(w, e, m.rawID, err)
		return
	}
	defer s.finish()
	if ex == nil { // server/discover
		writeJSON(w, discoverResponse(m.rawID, s.initResult))
		p.checkin(s)
		return
	}
	if p.deliver(w, r, s, ex, 1, false, jsonOK, sseOK) {
		p.checkin(s)
		return
	}
	s.end("the client went away before the response; its server is not reused")
}

// startModernRequest checks out a pooled server and sends it m; for
// server/discover it only checks one out (ex is nil). A server that ended
// between its checkout and the request is replaced once.
func (p *Proxy) startModernRequest(r *http.Request, e *serverEntry, key poolKey, clientInfo json.RawMessage, m message, sseOK bool) (*session, *exchange, error) {
	for attempt := 0; ; attempt++ {
		s, err := p.checkout(r.Context(), e, key, clientInfo)
		if err != nil {
			return nil, nil, err
		}
		s.begin()
		if m.method == "server/discover" {
			return s, nil, nil
		}
		ex, err := s.register([]message{m}, sseOK)
		if err == nil {
			err = s.send([]message{m})
			if err == nil || !errors.Is(err, errServerStalled) {
				return s, ex, nil // any other failure ends the session, which answers ex
			}
			s.abandon(ex)
		}
		s.finish()
		if !errors.Is(err, errSessionGone) || attempt > 0 {
			return nil, nil, err
		}
	}
}

func readModernParams(raw []byte, params *modernParams) error {
	var env struct {
		Params json.RawMessage `json:"params"`
	}
	if err := json.Unmarshal(raw, &env); err != nil {
		return fmt.Errorf("reading params: %w", err)
	}
	if len(env.Params) == 0 || isNull(env.Params) {
		return nil
	}
	if err := json.Unmarshal(env.Params, params); err != nil {
		return fmt.Errorf("params of an MCP %s request: %w", modernProtocolVersion, err)
	}
	return nil
}

// checkModernHeaders checks that the request's headers mirror its body, as
// 2026-07-28 requires of any server that reads the body.
func checkModernHeaders(h http.Header, method string, params modernParams) error {
	if v := h.Get(hdrProtocolVersion); params.Meta.Version != v {
		return fmt.Errorf("%w: %s is %q but params._meta[%q] is %q", errHeaderMismatch, hdrProtocolVersion, v, metaVersion, params.Meta.Version)
	}
	if got := h.Get(hdrMethod); got != method {
		return fmt.Errorf("%w: %s is %q but the body's method is %q", errHeaderMismatch, hdrMethod, got, method)
	}
	var want, field string
	switch method {
	case "tools/call", "prompts/get":
		want, field = params.Name, "params.name"
	case "resources/read":
		want, field = params.URI, "params.uri"
	default:
		return nil
	}
	got, err := decodeHeaderValue(h.Get(hdrName))
	if err != nil {
		return fmt.Errorf("%w: %s: %w", errHeaderMismatch, hdrName, err)
	}
	if got != want || h.Get(hdrName) == "" {
		return fmt.Errorf("%w: %s is %q but %s is %q", errHeaderMismatch, hdrName, got, field, want)
	}
	return nil
}

// decodeHeaderValue undoes the =?base64?...?= encoding of 2026-07-28 header
// values that are not plain ASCII.
func decodeHeaderValue(v string) (string, error) {
	inner, ok := strings.CutPrefix(v, base64HeaderPrefix)
	if !ok {
		return v, nil
	}
	inner, ok = strings.CutSuffix(inner, base64HeaderSuffix)
	if !ok {
		return v, nil
	}
	b, err := base64.StdEncoding.DecodeString(inner)
	if err != nil {
		return "", fmt.Errorf("decoding its base64 value: %w", err)
	}
	return string(b), nil
}

// discoverResponse answers server/discover from a pooled server's
// initialize result: its capabilities, instructions and serverInfo, and the
// revisions the proxy speaks.
func discoverResponse(id json.RawMessage, initResult json.RawMessage) []byte {
	var init struct {
		Capabilities json.RawMessage `json:"capabilities"`
		ServerInfo   json.RawMessage `json:"serverInfo"`
		Instructions string          `json:"instructions"`
	}
	_ = json.Unmarshal(initResult, &init) // the handshake checked it is an object
	if len(init.Capabilities) == 0 {
		init.Capabilities = json.RawMessage(`{}`)
	}
	type result struct {
		SupportedVersions []string                   `json:"supportedVersions"`
		Capabilities      json.RawMessage            `json:"capabilities"`
		Instructions      string                     `json:"instructions,omitempty"`
		Meta              map[string]json.RawMessage `json:"_meta,omitempty"`
	}
	res := result{SupportedVersions: protocolVersions, Capabilities: init.Capabilities, Instructions: init.Instructions}
	if len(init.ServerInfo) > 0 {
		res.Meta = map[string]json.RawMessage{metaServerInfo: init.ServerInfo}
	}
	b, err := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Result  result          `json:"result"`
	}{"2.0", id, res})
	if err != nil { // cannot happen: the raw parts came from valid JSON
		return rpcError(id, codeInternalError, "encoding the server/discover result: "+err.Error())
	}
	return modernResult("server/discover", b)
}

func writeJSON(w http.ResponseWriter, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(append(body, '\n'))
}

// cacheableMethods are the methods whose 2026-07-28 results must say how
// long and for whom they may be cached.
var cacheableMethods = []string{"tools/list", "prompts/list", "resources/list", "resources/templates/list", "resources/read", "server/discover"}

// modernResult turns the result of an initialize-based server into one of
// 2026-07-28, which requires "resultType" on every result (its clients no
// longer read a result without one as complete) and "ttlMs" and
// "cacheScope" on cacheable ones. The proxy cannot know how long a server's
// lists stay valid, so it says: do not cache (0 ms, private). Error
// responses and anything unreadable pass as they are.
func modernResult(method string, raw []byte) []byte {
	var msg map[string]json.RawMessage
	if json.Unmarshal(raw, &msg) != nil {
		return raw
	}
	var result map[string]json.RawMessage
	if json.Unmarshal(msg["result"], &result) != nil || result == nil {
		return raw
	}
	setDefault(result, "resultType", `"complete"`)
	if slices.Contains(cacheableMethods, method) {
		setDefault(result, "ttlMs", `0`)
		setDefault(result, "cacheScope", `"private"`)
	}
	b, err := json.Marshal(result)
	if err != nil {
		return raw
	}
	msg["result"] = b
	if b, err = json.Marshal(msg); err != nil {
		return raw
	}
	return b
}

func setDefault(obj map[string]json.RawMessage, key, value string) {
	if _, ok := obj[key]; !ok {
		obj[key] = json.RawMessage(value)
	}
}
