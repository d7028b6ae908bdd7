package egress

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Request rules through the proxy, on an intercepted host: reads and the
// writes they list pass with the secret put in; a write they refuse gets
// the proxy's 403 naming the rule and the command that allows it, never
// reaches the host and is logged without a header's value; the next
// request is served; a rule written to the policy file applies at once.
func TestRequestRulesThroughTheProxy(t *testing.T) {
	up := newUpstream(t, "allowed.test")
	f, c, _ := interceptFixture(t, up)
	rules := func(ss ...string) []RequestRule {
		var out []RequestRule
		for _, s := range ss {
			out = append(out, mustRule(t, s))
		}
		return out
	}
	pol := f.policy
	pol.Requests = rules(
		"allow POST allowed.test/graphql graphql:createPullRequest",
		"deny * allowed.test/graphql",
		"allow GET allowed.test/**",
		"allow POST allowed.test/repos/o/r/pulls",
		"deny * allowed.test/**")
	f.setPolicy(pol)
	base := "https://allowed.test:" + strconv.Itoa(up.port)
	do := func(method, path, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer PH-TOKEN")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	createPR := `{"query": "mutation PullRequestCreate($input: CreatePullRequestInput!) { createPullRequest(input: $input) { pullRequest { url } } }", "variables": {"input": {"title": "t"}}}`
	merge := `{"query": "mutation { mergePullRequest(input: {pullRequestId: \"p\"}) { clientMutationId } }"}`
	for _, tc := range []struct {
		method, path, body string
		code               int
		says               []string
	}{
		{"GET", "/repos/o/r/pulls?state=open", "", 200, []string{"answer to GET /repos/o/r/pulls"}},
		{"POST", "/repos/o/r/pulls", `{"title": "t", "head": "feat", "base": "main"}`, 200, nil},
		{"PUT", "/repos/o/r/pulls/1/merge", `{"merge_method": "squash"}`, 403, []string{
			"agent-vm: PUT allowed.test/repos/o/r/pulls/1/merge refused by this VM's request rules (rule: deny * allowed.test/**)",
			"agent-vm net allow --vm feat 'PUT allowed.test/repos/o/r/pulls/1/merge'"}},
		{"GET", "/after-a-refusal", "", 200, nil},
		{"POST", "/graphql", createPR, 200, nil},
		{"POST", "/graphql", merge, 403, []string{
			"(rule: deny * allowed.test/graphql)",
			"Before it, allow POST allowed.test/graphql graphql:createPullRequest did not match: the GraphQL mutation mergePullRequest is not on its list.",
			"agent-vm net allow --vm feat 'POST allowed.test/graphql graphql:mergePullRequest'"}},
	} {
		code, body := do(tc.method, tc.path, tc.body)
		if code != tc.code {
			t.Errorf("%s %s: %d %q, want %d", tc.method, tc.path, code, body, tc.code)
		}
		for _, s := range tc.says {
			if !strings.Contains(body, s) {
				t.Errorf("%s %s: the guest read %q, want it to say %q", tc.method, tc.path, body, s)
			}
		}
	}
	reqs, bodies := up.requests()
	var got []string
	for i, r := range reqs {
		got = append(got, r.Method+" "+r.URL.Path)
		if a := r.Header.Get("Authorization"); a != "Bearer real-token-value" {
			t.Errorf("%s %s reached the host with Authorization %q", r.Method, r.URL.Path, a)
		}
		if r.URL.Path == "/graphql" && bodies[i] != createPR {
			t.Errorf("the GraphQL body reached the host as %q, want it as sent", bodies[i])
		}
	}
	if strings.Join(got, ", ") != "GET /repos/o/r/pulls, POST /repos/o/r/pulls, GET /after-a-refusal, POST /graphql" {
		t.Errorf("the host got %v", got)
	}

	es := f.entries(6)
	var refused []LogEntry
	for _, e := range es {
		if e.Kind != "https" {
			t.Errorf("entry %+v, want kind https", e)
		}
		if !e.Allowed {
			refused = append(refused, e)
		}
	}
	if len(refused) != 2 || refused[0].Request != "PUT /repos/o/r/pulls/1/merge" || refused[0].Rule != "deny * allowed.test/**" ||
		refused[1].Request != "POST /graphql" || !strings.HasPrefix(refused[1].Rule, "deny * allowed.test/graphql; allow POST allowed.test/graphql graphql:createPullRequest did not match") ||
		len(refused[0].Secrets) != 0 {
		t.Errorf("refusals logged: %+v", refused)
	}
	raw, err := os.ReadFile(filepath.Join(f.dir, LogFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"PH-TOKEN", "real-token-value", "Bearer", "squash"} {
		if strings.Contains(string(raw), v) {
			t.Errorf("the log holds %q:\n%s", v, raw)
		}
	}

	// `net allow feat 'PUT allowed.test/repos/o/r/pulls/*/merge'`: the
	// proxy reads the new policy at its next request.
	pol.Requests = append(rules("allow PUT allowed.test/repos/o/r/pulls/*/merge"), pol.Requests...)
	f.setPolicy(pol)
	if code, body := do("PUT", "/repos/o/r/pulls/1/merge", `{}`); code != 200 {
		t.Errorf("the merge after its rule was added: %d %q", code, body)
	}
}

// An unreadable policy refuses the requests of an intercepted tunnel.
func TestRequestRefusedWithoutAPolicy(t *testing.T) {
	up := newUpstream(t, "allowed.test")
	f, c, _ := interceptFixture(t, up)
	req := mustRequest(t, "https://allowed.test:"+strconv.Itoa(up.port)+"/first")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err := os.WriteFile(filepath.Join(f.dir, PolicyFile), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	resp, err = c.Do(mustRequest(t, "https://allowed.test:"+strconv.Itoa(up.port)+"/second"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(b), "unreadable") {
		t.Errorf("a request in a live tunnel once the policy is unreadable: %d %q", resp.StatusCode, b)
	}
}

// A request that waits for 100 Continue is judged without its body when
// its path decides, and gets 100 Continue when a GraphQL rule must read
// the body: neither waits for the client to give up waiting.
func TestRequestRulesAndExpectContinue(t *testing.T) {
	up := newUpstream(t, "allowed.test")
	f, c, _ := interceptFixture(t, up)
	pol := f.policy
	pol.Requests = []RequestRule{mustRule(t, "allow POST allowed.test/graphql graphql:createPullRequest"), mustRule(t, "deny * allowed.test/**")}
	f.setPolicy(pol)
	c.Transport.(*http.Transport).ExpectContinueTimeout = time.Hour
	for _, tc := range []struct {
		path, body string
		code       int
	}{
		{"/repos/o/r/pulls/1/merge", `{"merge_method": "squash"}`, 403},
		{"/graphql", `{"query": "mutation { createPullRequest(input: {}) { pullRequest { url } } }"}`, 200},
		{"/graphql", `{"query": "mutation { mergePullRequest(input: {}) { clientMutationId } }"}`, 403},
	} {
		req, _ := http.NewRequest("POST", "https://allowed.test:"+strconv.Itoa(up.port)+tc.path, strings.NewReader(tc.body))
		req.Header.Set("Expect", "100-continue")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("POST %s: %v", tc.path, err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.code {
			t.Errorf("POST %s with Expect: 100-continue: %d, want %d", tc.path, resp.StatusCode, tc.code)
		}
	}
	if reqs, bodies := up.requests(); len(reqs) != 1 || !strings.Contains(bodies[0], "createPullRequest") {
		t.Errorf("the host got %d requests (%q), want the one allowed", len(reqs), bodies)
	}
}
