package mcpproxy

import (
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

func getHealth(t *testing.T, tp *testProxy, path string) (int, HealthReport, string) {
	t.Helper()
	resp := tp.do("GET", path, "", map[string]string{"Authorization": ""})
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var rep HealthReport
	if err := json.Unmarshal(body, &rep); err != nil {
		t.Fatalf("health body %s: %v", body, err)
	}
	return resp.StatusCode, rep, string(body)
}

func TestHealth(t *testing.T) {
	ok := testServerCmd(t, "ok", "1")
	ok.Args = []string{"--secret-arg=hunter2"}
	ok.Env["API_KEY"] = "hunter3"
	missing := Server{Name: "missing", Command: "no-such-mcp-server-xyz"}
	unset := Server{Name: "unset", Command: "sh", Problem: "environment variable GITHUB_TOKEN is not set"}
	tp := startProxy(t, []Server{ok, missing, unset}, func(o *Options) { o.HealthPath = "/healthz" })
	tp.initialize("/servers/ok/mcp")

	status, rep, body := getHealth(t, tp, "/healthz")
	want := HealthReport{Status: "ok", Servers: []ServerHealth{
		{Name: "missing", Problem: `command "no-such-mcp-server-xyz" not found on PATH (hint: install it in the VM, or give its absolute path)`},
		{Name: "ok", CanStart: true, Sessions: 1},
		{Name: "unset", Problem: "environment variable GITHUB_TOKEN is not set"},
	}}
	if status != 200 || !reflect.DeepEqual(rep, want) {
		t.Errorf("got %d %+v, want 200 %+v", status, rep, want)
	}
	for _, secret := range []string{"hunter2", "hunter3", testToken} {
		if strings.Contains(body, secret) {
			t.Errorf("health reveals %q: %s", secret, body)
		}
	}
	// A server that cannot start refuses sessions with its problem.
	resp, msgs := tp.post("/servers/missing/mcp", "", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}`)
	if resp.StatusCode != http.StatusBadGateway || len(msgs) != 1 || !strings.Contains(string(msgs[0]), "not found on PATH") || string(decode(t, msgs[0]).ID) != "0" {
		t.Errorf("initialize on a broken server: %d %s; want 502 answering id 0 with the reason", resp.StatusCode, msgs)
	}
}

func TestHealthUnavailableWhenNoServerCanStart(t *testing.T) {
	tp := startProxy(t, []Server{{Name: "missing", Command: "/nonexistent/srv"}}, nil)
	if status, rep, _ := getHealth(t, tp, "/health"); status != http.StatusServiceUnavailable || rep.Status != "unavailable" {
		t.Errorf("got %d %+v, want 503 unavailable", status, rep)
	}
}

func TestHealthWithNoServers(t *testing.T) {
	tp := startProxy(t, nil, nil)
	status, rep, body := getHealth(t, tp, "/health")
	if status != 200 || rep.Status != "ok" || !strings.Contains(body, `"servers": []`) {
		t.Errorf("got %d %s, want 200 with an empty list", status, body)
	}
	resp, _ := tp.post("/mcp", "", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}`)
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("/mcp with no servers: status %d, want 404", resp.StatusCode)
	}
}
