package egress

import (
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

// A pattern is read into its canonical text; what is not a pattern is an
// error that quotes it and says how to write it.
func TestParseRequestPattern(t *testing.T) {
	for in, want := range map[string]string{
		"POST api.github.com/repos/o/r/pulls":          "POST api.github.com/repos/o/r/pulls",
		"  get   API.GitHub.com/**  ":                  "GET api.github.com/**",
		"* api.github.com/**":                          "* api.github.com/**",
		"DELETE api.github.com/repos/*/*/git/refs/**":  "DELETE api.github.com/repos/*/*/git/refs/**",
		"GET api.github.com/":                          "GET api.github.com/",
		"POST api.github.com/graphql graphql":          "POST api.github.com/graphql graphql",
		"POST api.github.com/graphql graphql:a,b,a":    "POST api.github.com/graphql graphql:a,b",
		"PUT example.org/a/b.c/~d/x@y:z/(1)+2;3=4,5!$": "PUT example.org/a/b.c/~d/x@y:z/(1)+2;3=4,5!$",
	} {
		pt, err := ParseRequestPattern(in)
		if err != nil || pt.String() != want {
			t.Errorf("ParseRequestPattern(%q) = %q, %v; want %q", in, pt.String(), err, want)
		}
	}
	for in, want := range map[string]string{
		"":                                        "empty (hint: METHOD host/path",
		"FOO api.github.com/x":                    `"FOO" is not an HTTP method (hint: GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS, or * for any)`,
		"GET /x":                                  "no host before the path (hint: GET api.github.com/x)",
		"GET api.github.com":                      "no path after the host (hint: GET api.github.com/** for every path)",
		"GET 1.2.3.4/x":                           "1.2.3.4 is an IP address: a rule names the host a secret is bound to",
		"GET [::1]/x":                             "is an IP address",
		"GET *.github.com/x":                      "no wildcard",
		"GET api.github.com:443/x":                "has no port",
		"GET https://api.github.com/x":            "names no scheme",
		"GET exa_mple..com/x":                     "is not a host name",
		"api.github.com/x":                        "a rule is METHOD host/path (hint: e.g. 'GET api.github.com/x')",
		"GET api.github.com/x y z":                "more words",
		"GET api.github.com/a//b":                 "an empty segment",
		"GET api.github.com/a/":                   "an empty segment",
		"GET api.github.com/**/x":                 "** stands for the rest of the path",
		"GET api.github.com/a*":                   "* stands for a whole segment",
		"GET api.github.com/../x":                 "a .. segment",
		"GET api.github.com/a%2Fb":                "a segment is *, ** or letters",
		"GET api.github.com/a?b=c":                "a segment is *, ** or letters",
		"GET api.github.com/it's":                 "a segment is *, ** or letters",
		"GET api.github.com/graphql graphql":      "a graphql condition reads a POST's body",
		"POST api.github.com/graphql mutations:a": `"mutations:a" is not a condition`,
		"POST api.github.com/graphql graphql:a-b": `"a-b" is not the name of a GraphQL field`,
		"POST api.github.com/graphql graphql:":    `"" is not the name of a GraphQL field`,
	} {
		_, err := ParseRequestPattern(in)
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "request rule ") {
			t.Errorf("ParseRequestPattern(%q): %v; want an error with %q", in, err, want)
		}
	}
	if _, err := NewRequestRule(false, "POST api.github.com/graphql graphql:a"); err == nil || !strings.Contains(err.Error(), "a deny rule has no graphql condition (hint: deny 'POST api.github.com/graphql'") {
		t.Errorf("a deny rule with a graphql condition: %v", err)
	}
	if _, err := ParseRequestRule("permit GET a.b/c"); err == nil || !strings.Contains(err.Error(), "allow or deny") {
		t.Errorf("a rule with another verdict: %v", err)
	}
}

// Rules are strings in the policy file, and read back as they were.
func TestRequestRulesInThePolicyFile(t *testing.T) {
	p := Policy{Mode: ModeAllow, Requests: []RequestRule{
		mustRule(t, "allow POST api.github.com/graphql graphql:createPullRequest"),
		mustRule(t, "deny * api.github.com/**"),
	}}
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"requests":["allow POST api.github.com/graphql graphql:createPullRequest","deny * api.github.com/**"]`) {
		t.Errorf("the policy as JSON: %s", b)
	}
	var back Policy
	if err := json.Unmarshal(b, &back); err != nil || !reflect.DeepEqual(back, p) {
		t.Errorf("read back: %+v, %v; want %+v", back, err, p)
	}
	if err := json.Unmarshal([]byte(`{"mode": "allow", "requests": ["allow FOO a.b/c"]}`), &back); err == nil {
		t.Errorf("a policy with a bad rule was read")
	}
}

func mustRule(t *testing.T, s string) RequestRule {
	t.Helper()
	r, err := ParseRequestRule(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// githubRules stand for netpolicy's GitHub defaults for upstream o/r, after a
// rule of the user's.
var githubRules = []string{
	"deny POST api.github.com/repos/o/r/issues/*/comments",
	"allow POST api.github.com/graphql graphql:createPullRequest,addComment",
	"deny * api.github.com/graphql",
	"allow GET api.github.com/**",
	"allow POST api.github.com/repos/o/r/pulls",
	"allow POST api.github.com/repos/o/r/pulls/*/comments",
	"deny * api.github.com/**",
}

func gqlBody(query string) string {
	b, _ := json.Marshal(map[string]any{"query": query, "variables": map[string]any{"input": map[string]string{"body": "mutation { mergePullRequest }"}}})
	return string(b)
}

// The first rule that matches decides; no match is allowed; what the
// rules cannot judge plainly is refused; a GraphQL rule reads the body
// and puts it back.
func TestDecideRequest(t *testing.T) {
	var p Policy
	for _, s := range githubRules {
		p.Requests = append(p.Requests, mustRule(t, s))
	}
	for _, tc := range []struct {
		method, target, body string
		header               map[string]string
		host                 string
		allowed              bool
		rule, note, fix      string
	}{
		{method: "GET", target: "/repos/o/r/pulls?state=open", allowed: true, rule: "allow GET api.github.com/**"},
		{method: "GET", target: "/", allowed: true, rule: "allow GET api.github.com/**"},
		{method: "HEAD", target: "/x", rule: "deny * api.github.com/**", fix: "HEAD api.github.com/x"},
		{method: "POST", target: "/repos/o/r/pulls", allowed: true, rule: "allow POST api.github.com/repos/o/r/pulls"},
		{method: "POST", target: "/repos/o/r/pulls/7/comments", allowed: true, rule: "allow POST api.github.com/repos/o/r/pulls/*/comments"},
		{method: "POST", target: "/repos/o/r/pulls/", rule: "deny * api.github.com/**"},
		{method: "POST", target: "/repos/O/R/pulls", rule: "deny * api.github.com/**", fix: "POST api.github.com/repos/O/R/pulls"},
		{method: "POST", target: "/repos/o/r/pulls/7%2Fx/comments", rule: "deny * api.github.com/**"},
		{method: "POST", target: "/repos/o/r/issues/7/comments", rule: "deny POST api.github.com/repos/o/r/issues/*/comments", fix: "POST api.github.com/repos/o/r/issues/7/comments"},
		{method: "POST", target: "/REPOS/o/r/Issues/7/comments", rule: "deny POST api.github.com/repos/o/r/issues/*/comments", fix: "POST api.github.com/REPOS/o/r/Issues/7/comments"},
		{method: "post", target: "/repos/o/r/issues/7/comments", rule: "deny POST api.github.com/repos/o/r/issues/*/comments"},
		{method: "PUT", target: "/repos/o/r/pulls/7/merge", rule: "deny * api.github.com/**", fix: "PUT api.github.com/repos/o/r/pulls/7/merge"},
		{method: "PATCH", target: "/repos/o/r", rule: "deny * api.github.com/**", fix: "PATCH api.github.com/repos/o/r"},
		{method: "DELETE", target: "/repos/o/r/git/refs/heads/main", rule: "deny * api.github.com/**", fix: "DELETE api.github.com/repos/o/r/git/refs/heads/main"},
		{method: "POST", target: "/repos/other/r/pulls", rule: "deny * api.github.com/**", fix: "POST api.github.com/repos/other/r/pulls"},
		{method: "PUT", target: "/repos/o/r/pulls/7/merge", host: "example.org", allowed: true},
		{method: "PUT", target: "/x/../repos/o/r/pulls/7/merge", rule: "a path with a . or .. segment, which the request rules do not judge"},
		{method: "POST", target: "/repos/o/r/pulls/%2e%2e/%2E%2E/x/pulls", rule: "a path with a . or .. segment"},
		{method: "POST", target: "/repos/o/r/pulls/1%2F..%2F..%2Fy/comments", rule: "a path with a . or .. segment"},
		{method: "POST", target: "/repos/o/r/pulls/%252e%252e/comments", rule: "an escape escaped again"},
		{method: "POST", target: "/repos/o/r//pulls", rule: "an empty segment"},
		{method: "POST", target: "/repos/o/r/pulls", header: map[string]string{"X-HTTP-Method-Override": "PUT"}, rule: "the header X-HTTP-Method-Override"},
		{method: "POST", target: "/repos/o/r/pulls?_method=PUT", rule: "_method in its query"},
		{method: "POST", target: "/repos/o/r/pulls?a=%zz&%5Fmethod=PUT", rule: "_method in its query"},

		{method: "POST", target: "/graphql", body: gqlBody(`query { viewer { login } }`), allowed: true, rule: "allow POST api.github.com/graphql graphql:createPullRequest,addComment"},
		{method: "POST", target: "/graphql", body: gqlBody(`mutation M($input: CreatePullRequestInput!) { createPullRequest(input: $input) { pullRequest { url } } }`),
			allowed: true, rule: "allow POST api.github.com/graphql graphql:createPullRequest,addComment"},
		{method: "POST", target: "/graphql", body: gqlBody(`mutation { addComment: mergePullRequest(input: {}) { clientMutationId } }`),
			rule: "deny * api.github.com/graphql", note: "the GraphQL mutation mergePullRequest is not on its list", fix: "POST api.github.com/graphql graphql:mergePullRequest"},
		{method: "POST", target: "/graphql", body: gqlBody(`query { a } mutation { createPullRequest(input: {}) { x } deleteRef(input: {}) { x } }`),
			rule: "deny * api.github.com/graphql", note: "mutation deleteRef is not", fix: "POST api.github.com/graphql graphql:createPullRequest,deleteRef"},
		{method: "POST", target: "/graphql", body: gqlBody(`subscription { a }`), rule: "deny * api.github.com/graphql", note: "a GraphQL subscription", fix: "POST api.github.com/graphql"},
		{method: "POST", target: "/graphql", body: `{"query": "{ a }", "query": "mutation { mergePullRequest }"}`, rule: "deny * api.github.com/graphql", note: "not GraphQL the proxy reads with certainty", fix: "POST api.github.com/graphql"},
		{method: "POST", target: "/graphql", body: "query { a }", rule: "deny * api.github.com/graphql", note: "not a JSON object", fix: "POST api.github.com/graphql"},
		{method: "POST", target: "/graphql?query=mutation", body: gqlBody(`{ a }`), rule: "deny * api.github.com/graphql", note: "a query string", fix: "POST api.github.com/graphql"},
		{method: "POST", target: "/graphql", body: gqlBody(`{ a }`), header: map[string]string{"Content-Encoding": "gzip"}, rule: "deny * api.github.com/graphql", note: "Content-Encoding gzip", fix: "POST api.github.com/graphql"},
		{method: "POST", target: "/graphql", body: gqlBody(`{ a }`) + strings.Repeat(" ", maxInspectedBody), rule: "deny * api.github.com/graphql", note: "a body over 1 MiB", fix: "POST api.github.com/graphql"},
		{method: "GET", target: "/graphql?query={viewer{login}}", rule: "deny * api.github.com/graphql", fix: "GET api.github.com/graphql"},
	} {
		req, err := http.NewRequest(tc.method, "https://api.github.com"+tc.target, strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range tc.header {
			req.Header.Set(k, v)
		}
		host := tc.host
		if host == "" {
			host = "api.github.com"
		}
		d := p.DecideRequest(host, req)
		name := tc.method + " " + tc.target
		if d.Allowed != tc.allowed || !strings.Contains(d.Rule, tc.rule) || !strings.Contains(d.Note, tc.note) || (tc.note == "") != (d.Note == "") || d.Fix != tc.fix {
			t.Errorf("%s: %+v\nwant allowed %v, rule %q, note %q, fix %q", name, d, tc.allowed, tc.rule, tc.note, tc.fix)
		}
		if b, _ := io.ReadAll(req.Body); string(b) != tc.body {
			t.Errorf("%s: the body left for the host has %d bytes, want the %d sent", name, len(b), len(tc.body))
		}
	}
}

// A Policy without request rules allows every request, whatever it is.
func TestNoRequestRules(t *testing.T) {
	req, _ := http.NewRequest("DELETE", "https://api.github.com/x/../y", nil)
	req.Header.Set("X-HTTP-Method-Override", "PUT")
	if d := (Policy{}).DecideRequest("api.github.com", req); !d.Allowed {
		t.Errorf("no rules: %+v", d)
	}
}

// FuzzParseRequestPattern: what ParseRequestPattern takes it writes as
// text that it reads back the same, and a rule matches the request its
// own literal path names.
func FuzzParseRequestPattern(f *testing.F) {
	for _, s := range []string{"POST api.github.com/repos/o/r/pulls", "* a.b/**", "get A.b/x/*/y", "POST h.io/graphql graphql:a,b", "GET 1.2.3.4/x", "GET a.b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		pt, err := ParseRequestPattern(s)
		if err != nil {
			return
		}
		again, err := ParseRequestPattern(pt.String())
		if err != nil || !reflect.DeepEqual(again, pt) {
			t.Fatalf("%q reads as %q, which reads as %+v, %v", s, pt.String(), again, err)
		}
		if strings.Contains(pt.Path, "*") || pt.Method == "*" {
			return
		}
		req, err := http.NewRequest(pt.Method, "https://"+pt.Host+pt.Path, nil)
		if err != nil {
			return
		}
		segs, odd := requestPath(req)
		if odd != "" || !pt.matches(pt.Method, pt.Host, segs, false) {
			t.Fatalf("%q does not match its own path %s (%q, %s)", pt.String(), pt.Path, segs, odd)
		}
	})
}
