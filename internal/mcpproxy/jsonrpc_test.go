package mcpproxy

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestParseMessage(t *testing.T) {
	cases := []struct {
		in       string
		kind     msgKind
		id       string
		method   string
		progress string
		wantErr  string
	}{
		{in: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"_meta":{"progressToken":"t1"}}}`, kind: kindRequest, id: "n1", method: "tools/call", progress: "st1"},
		{in: `{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":7,"progress":1}}`, kind: kindNotification, method: "notifications/progress", progress: "n7"},
		{in: `{"jsonrpc":"2.0","method":"notifications/message","params":{"progressToken":7}}`, kind: kindNotification, method: "notifications/message"},
		{in: `{"jsonrpc":"2.0","id":"a","result":{}}`, kind: kindResponse, id: "sa"},
		{in: `{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"x"}}`, kind: kindResponse, id: ""},
		{in: `{"jsonrpc":"2.0","id":1,"result":{},"error":{}}`, wantErr: "exactly one"},
		{in: `{"jsonrpc":"2.0","id":1}`, wantErr: "exactly one"},
		{in: `{"jsonrpc":"2.0","id":true,"method":"x"}`, wantErr: `"id" must be a string or a number`},
		{in: `{"jsonrpc":"2.0","method":""}`, wantErr: `"method" must be a non-empty string`},
		{in: `{"jsonrpc":"2.0","method":3}`, wantErr: `"method" must be a non-empty string`},
		{in: `{"jsonrpc":"1.0","method":"x"}`, wantErr: `"jsonrpc" must be "2.0"`},
		{in: `[1]`, wantErr: "must be an object"},
	}
	for _, c := range cases {
		m, err := parseMessage([]byte(c.in))
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%s: got %v, want error containing %q", c.in, err, c.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.in, err)
			continue
		}
		if m.kind != c.kind || m.id != c.id || m.method != c.method || m.progress != c.progress {
			t.Errorf("%s: got kind %d id %q method %q progress %q", c.in, m.kind, m.id, m.method, m.progress)
		}
	}
}

func TestIDKeyMatchesReencodedIDs(t *testing.T) {
	same := [][2]string{
		{`1`, `1.0`},
		{`100`, `1e2`},
		{`"a"`, `"\u0061"`},
		{`-3`, `-3.0`},
		{`1.5`, `1.50`},
	}
	for _, p := range same {
		a, errA := idKey(json.RawMessage(p[0]))
		b, errB := idKey(json.RawMessage(p[1]))
		if errA != nil || errB != nil || a != b {
			t.Errorf("%s and %s: keys %q, %q (%v, %v); want equal", p[0], p[1], a, b, errA, errB)
		}
	}
	a, _ := idKey(json.RawMessage(`1`))
	b, _ := idKey(json.RawMessage(`"1"`))
	if a == b {
		t.Errorf("number 1 and string \"1\" share key %q", a)
	}
}

func TestParseBodyCompactsMessages(t *testing.T) {
	msgs, batch, err := parseBody([]byte("[\n {\"jsonrpc\": \"2.0\", \"id\": 1, \"method\": \"a\"},\n {\"jsonrpc\": \"2.0\", \"method\": \"b\"}\n]"))
	if err != nil || !batch || len(msgs) != 2 {
		t.Fatalf("got %d messages, batch %v, %v", len(msgs), batch, err)
	}
	for _, m := range msgs {
		if strings.ContainsAny(string(m.raw), "\n ") {
			t.Errorf("message %q is not compact", m.raw)
		}
	}
}

func FuzzParseBody(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"x"}`,
		`[{"jsonrpc":"2.0","id":"a","result":{}},{"jsonrpc":"2.0","method":"n"}]`,
		`{"jsonrpc":"2.0","id":1.5e3,"error":{"code":1,"message":"m"}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		msgs, _, err := parseBody(body)
		if err != nil {
			return
		}
		for _, m := range msgs {
			// What goes to a server's stdin must be one line of valid JSON.
			if strings.ContainsAny(string(m.raw), "\r\n") || !json.Valid(m.raw) {
				t.Fatalf("message %q would break the stdio framing", m.raw)
			}
			if m.kind != kindNotification && m.kind != kindResponse && m.id == "" {
				t.Fatalf("request %q without an id key", m.raw)
			}
		}
	})
}
