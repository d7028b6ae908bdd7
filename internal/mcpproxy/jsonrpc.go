package mcpproxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// The proxy relays JSON-RPC messages as they are. It reads only the envelope
// (id, method, whether it is a response, a progress token) to route each
// message to the right HTTP stream; params and results pass through untouched.

// JSON-RPC error codes the proxy itself answers with.
const (
	codeParseError     = -32700
	codeInvalidRequest = -32600
	codeInternalError  = -32603
	// codeConnectionClosed is what the MCP SDKs use when the peer went away
	// before answering (the TypeScript SDK's ErrorCode.ConnectionClosed).
	codeConnectionClosed = -32000
	// codeRequestCancelled answers a request the client cancelled, should the
	// client still be listening (it ignores it by the spec).
	codeRequestCancelled = -32800
	codeMethodNotFound   = -32601
	// MCP 2026-07-28: the HTTP headers do not match the body, and a protocol
	// revision the server does not speak.
	codeHeaderMismatch     = -32020
	codeUnsupportedVersion = -32022
)

type msgKind int

const (
	kindRequest msgKind = iota + 1
	kindNotification
	kindResponse
)

// message is one JSON-RPC message: its bytes (compact, on one line, as they
// travel on the child's stdin/stdout) and the envelope fields used for routing.
type message struct {
	raw    []byte
	kind   msgKind
	rawID  json.RawMessage // requests and responses, as written by the sender
	id     string          // rawID normalised (see idKey); "" for notifications
	method string          // requests and notifications
	// progress is the progress token: for a request the one it asks progress
	// for (params._meta.progressToken), for notifications/progress the one it
	// reports on. Normalised like id; "" when there is none.
	progress string
	// cancels is, for notifications/cancelled, the id of the request it
	// cancels, normalised like id.
	cancels string
}

type envelope struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Method  json.RawMessage `json:"method"`
	Params  json.RawMessage `json:"params"`
	Result  json.RawMessage `json:"result"`
	Error   json.RawMessage `json:"error"`
}

// errNotJSON marks input that is not JSON at all (a parse error, -32700), as
// opposed to JSON that is not a valid JSON-RPC message (-32600).
var errNotJSON = errors.New("not valid JSON")

// parseMessage classifies one compact JSON value as a JSON-RPC message.
func parseMessage(raw []byte) (message, error) {
	var env envelope
	if err := json.Unmarshal(raw, &env); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			return message{}, fmt.Errorf("a JSON-RPC message must be an object with \"jsonrpc\": \"2.0\"")
		}
		return message{}, fmt.Errorf("%w: %v", errNotJSON, err)
	}
	if env.JSONRPC != "2.0" {
		return message{}, errors.New(`"jsonrpc" must be "2.0"`)
	}
	m := message{raw: raw}
	hasID := len(env.ID) > 0
	if len(env.Method) > 0 {
		if err := json.Unmarshal(env.Method, &m.method); err != nil || m.method == "" {
			return message{}, errors.New(`"method" must be a non-empty string`)
		}
		m.kind = kindNotification
		if hasID {
			m.kind = kindRequest
			key, err := idKey(env.ID)
			if err != nil {
				return message{}, err
			}
			m.rawID, m.id = env.ID, key
		}
		m.progress = progressToken(m, env.Params)
		if m.kind == kindNotification && m.method == "notifications/cancelled" {
			var p struct {
				RequestID json.RawMessage `json:"requestId"`
			}
			if json.Unmarshal(env.Params, &p) == nil && len(p.RequestID) > 0 {
				m.cancels, _ = idKey(p.RequestID)
			}
		}
		return m, nil
	}
	if !hasID || (len(env.Result) > 0) == (len(env.Error) > 0) {
		return message{}, errors.New(`a JSON-RPC message needs a "method" (request or notification) or an "id" with exactly one of "result" and "error" (response)`)
	}
	m.kind = kindResponse
	m.rawID = env.ID
	if !isNull(env.ID) { // an error response may carry a null id
		key, err := idKey(env.ID)
		if err != nil {
			return message{}, err
		}
		m.id = key
	}
	return m, nil
}

// progressToken extracts the progress token a message carries, if any.
func progressToken(m message, params json.RawMessage) string {
	if len(params) == 0 {
		return ""
	}
	var tok json.RawMessage
	switch {
	case m.kind == kindRequest:
		var p struct {
			Meta struct {
				ProgressToken json.RawMessage `json:"progressToken"`
			} `json:"_meta"`
		}
		if json.Unmarshal(params, &p) != nil {
			return ""
		}
		tok = p.Meta.ProgressToken
	case m.method == "notifications/progress":
		var p struct {
			ProgressToken json.RawMessage `json:"progressToken"`
		}
		if json.Unmarshal(params, &p) != nil {
			return ""
		}
		tok = p.ProgressToken
	default:
		return ""
	}
	key, err := idKey(tok)
	if err != nil {
		return ""
	}
	return key
}

// idKey normalises a JSON-RPC id (a string or a number) so that the id a
// client sent and the id a server echoes compare equal even when the server
// re-encoded it ("1.0" and "1", "\u0061" and "a").
func idKey(raw json.RawMessage) (string, error) {
	bad := errors.New(`"id" must be a string or a number`)
	switch {
	case len(raw) == 0:
		return "", bad
	case raw[0] == '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", bad
		}
		return "s" + s, nil
	case raw[0] == '-' || (raw[0] >= '0' && raw[0] <= '9'):
		if i, err := strconv.ParseInt(string(raw), 10, 64); err == nil {
			return "n" + strconv.FormatInt(i, 10), nil
		}
		f, err := strconv.ParseFloat(string(raw), 64)
		if err != nil {
			return "", bad
		}
		if f == float64(int64(f)) {
			return "n" + strconv.FormatInt(int64(f), 10), nil
		}
		return "n" + strconv.FormatFloat(f, 'g', -1, 64), nil
	default:
		return "", bad
	}
}

func isNull(raw json.RawMessage) bool { return bytes.Equal(raw, []byte("null")) }

// parseBody splits an HTTP request body into JSON-RPC messages, each compacted
// onto one line (the stdio transport forbids embedded newlines). batch reports
// whether the body was a JSON array.
func parseBody(body []byte) (msgs []message, batch bool, err error) {
	var buf bytes.Buffer
	if err := json.Compact(&buf, body); err != nil {
		return nil, false, fmt.Errorf("%w: %v", errNotJSON, err)
	}
	compact := buf.Bytes()
	if len(compact) > 0 && compact[0] == '[' {
		var elems []json.RawMessage
		if err := json.Unmarshal(compact, &elems); err != nil {
			return nil, true, fmt.Errorf("%w: %v", errNotJSON, err)
		}
		if len(elems) == 0 {
			return nil, true, errors.New("an empty batch is not a valid JSON-RPC message")
		}
		for i, e := range elems {
			m, err := parseMessage(e)
			if err != nil {
				return nil, true, fmt.Errorf("batch element %d: %w", i, err)
			}
			msgs = append(msgs, m)
		}
		return msgs, true, checkUniqueIDs(msgs)
	}
	m, err := parseMessage(compact)
	if err != nil {
		return nil, false, err
	}
	return []message{m}, false, nil
}

func checkUniqueIDs(msgs []message) error {
	seen := map[string]bool{}
	for _, m := range msgs {
		if m.kind != kindRequest {
			continue
		}
		if seen[m.id] {
			return fmt.Errorf("request id %s appears twice in one batch", m.rawID)
		}
		seen[m.id] = true
	}
	return nil
}

// rpcError renders a JSON-RPC error response. id is the raw id to answer, or
// nil for an error that answers no particular request (id null).
func rpcError(id json.RawMessage, code int, msg string) []byte {
	return rpcErrorData(id, code, msg, nil)
}

// rpcErrorData is rpcError with the error's optional data member.
func rpcErrorData(id json.RawMessage, code int, msg string, data any) []byte {
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	type rpcErr struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
		Data    any    `json:"data,omitempty"`
	}
	b, err := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   rpcErr          `json:"error"`
	}{JSONRPC: "2.0", ID: id, Error: rpcErr{code, msg, data}})
	if err != nil { // cannot happen: every field marshals
		panic(err)
	}
	return b
}
