package gqlscan

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// Documents as gh and the GitHub client libraries send them.
var (
	// gh pr create.
	ghCreatePR = `
	mutation PullRequestCreate($input: CreatePullRequestInput!) {
		createPullRequest(input: $input) {
			pullRequest {
				id
				url
			}
		}
	}`
	// gh pr merge, as shurcooL/githubv4 writes it.
	ghMerge = `mutation($input:MergePullRequestInput!){mergePullRequest(input: $input){clientMutationId}}`
	// gh pr status: a query with fragments.
	ghStatus = `
	fragment pr on PullRequest { number title state url headRefName
		statusCheckRollup: commits(last: 1) { nodes { commit { oid } } } }
	fragment prWithReviews on PullRequest { ...pr reviewDecision }
	query PullRequestStatus($owner: String!, $repo: String!, $headRefName: String!, $viewerQuery: String!, $per_page: Int = 10) {
		repository(owner: $owner, name: $repo) {
			defaultBranchRef { name }
			pullRequests(headRefName: $headRefName, first: $per_page, orderBy: { field: CREATED_AT, direction: DESC }) {
				totalCount
				edges { node { ...prWithReviews } }
			}
		}
		viewerCreated: search(query: $viewerQuery, type: ISSUE, first: $per_page) {
			totalCount: issueCount
			edges { node { ...prWithReviews } }
		}
	}`
)

func TestScan(t *testing.T) {
	for _, tc := range []struct {
		name, doc string
		want      []Operation
	}{
		{"gh pr create", ghCreatePR, []Operation{{Mutation, "PullRequestCreate", []string{"createPullRequest"}}}},
		{"gh pr merge", ghMerge, []Operation{{Mutation, "", []string{"mergePullRequest"}}}},
		{"gh pr status", ghStatus, []Operation{{Query, "PullRequestStatus", []string{"repository", "search"}}}},
		{"anonymous query", `{ viewer { login } }`, []Operation{{Query, "", []string{"viewer"}}}},
		{"an alias is its field", `mutation { ok: addComment(input: {subjectId: "x", body: "y"}) { clientMutationId }
			merge: mergePullRequest(input: {pullRequestId: "p"}) { clientMutationId } }`,
			[]Operation{{Mutation, "", []string{"addComment", "mergePullRequest"}}}},
		{"an alias named like an allowed field", `mutation { addComment: mergePullRequest(input: {}) { x } }`,
			[]Operation{{Mutation, "", []string{"mergePullRequest"}}}},
		{"comments and strings that say mutation", `
			# mutation { mergePullRequest }
			query Q { search(query: "mutation { mergePullRequest(input: {}) { x } }", type: ISSUE, first: 1) { issueCount } # }
			  other: repository(owner: """ } mutation { deleteRepository """, name: "\" } mutation {") { id } }`,
			[]Operation{{Query, "Q", []string{"search", "repository"}}}},
		{"several operations", `query A { viewer { login } } mutation B { createPullRequest(input: $i) { x } } mutation C { mergePullRequest(input: $i) { x } }`,
			[]Operation{{Query, "A", []string{"viewer"}}, {Mutation, "B", []string{"createPullRequest"}}, {Mutation, "C", []string{"mergePullRequest"}}}},
		{"a fragment at a mutation's root", `mutation { ...M } fragment M on Mutation { mergePullRequest(input: {}) { x } ...N } fragment N on Mutation { deleteRef(input: {}) { x } }`,
			[]Operation{{Mutation, "", []string{"mergePullRequest", "deleteRef"}}}},
		{"an inline fragment at a mutation's root", `mutation { ... on Mutation { mergePullRequest(input: {}) { x } } ... @include(if: true) { addComment(input: {}) { x } } }`,
			[]Operation{{Mutation, "", []string{"mergePullRequest", "addComment"}}}},
		{"directives, variables, defaults, lists, objects, numbers", `mutation M($a: [[ID!]!] = [["x"]], $b: Float = -1.5e3 @deprecated) @dir(x: 1) {
			createPullRequest(input: {a: [1, 2.0, -0, true, null, ENUM, $a, {b: []}], c: {}}) @skip(if: false) { x }, createPullRequest(input: $b) { y } }`,
			[]Operation{{Mutation, "M", []string{"createPullRequest"}}}},
		{"keywords as names", `query query { mutation: subscription { fragment on } }`, []Operation{{Query, "query", []string{"subscription"}}}},
		{"a subscription", `subscription { events { id } }`, []Operation{{Subscription, "", []string{"events"}}}},
		{"commas, CRs and tabs are ignored", "mutation,\r{\taddComment(input:$i,),{x},}", []Operation{{Mutation, "", []string{"addComment"}}}},
	} {
		got, err := Scan(tc.doc)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: got %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// What the scanner cannot read with certainty is an error.
func TestScanRefuses(t *testing.T) {
	for doc, want := range map[string]string{
		"":                                           "no operation",
		"# just a comment":                           "no operation",
		`fragment F on Query { x }`:                  "no operation",
		`mutation { a } }`:                           "where an operation or a fragment begins",
		`mutation { a `:                              "the end of the document where a name belongs",
		`mutation {}`:                                "empty selection set",
		`mutation { a(x: "unterminated) }`:           "without its closing quote",
		"mutation { a(x: \"line\nend\") }":           "a line end in a string",
		`mutation { a(x: "\q") }`:                    "escape",
		`mutation { a(x: """ \""" """) }`:            `escaped triple quote`,
		`mutation { a(x: """ open) }`:                "without its closing quotes",
		"# comment\u2028mutation { a }":              "in a comment",
		"\ufeffmutation { a }":                       "outside a string",
		"mutation\x00{ a }":                          "outside a string",
		"mutation\u00a0{ a }":                        "outside a string",
		`mutation { a(x: 01) }`:                      "leading zero",
		`mutation { a(x: 1.) }`:                      "fraction without digits",
		`mutation { a(x: 1e) }`:                      "exponent without digits",
		`mutation { a(x: 1x) }`:                      `a number followed by 'x'`,
		`mutation { a(x: -) }`:                       "minus sign",
		`mutation { a(x: ..) }`:                      "unexpected character",
		`mutation { ...F }`:                          "fragment F is spread but not defined",
		`mutation { ...F } fragment F on M { ...F }`: "fragment F spreads itself",
		`mutation { ...F } fragment F on M { ...G } fragment G on M { ...F }`: "spreads itself",
		`fragment F on M { a } fragment F on M { b } mutation { ...F }`:       "defined twice",
		`fragment on on M { a }`:         `"on" where a fragment's name belongs`,
		`type Mutation { a: Int }`:       "where an operation or a fragment begins",
		`extend type Query { a: Int }`:   "where an operation or a fragment begins",
		`"description" mutation { a }`:   "a string where an operation or a fragment begins",
		`mutation { a() }`:               "empty arguments",
		`mutation M() { a }`:             "empty variable definitions",
		`mutation M($a: Int = $b) { a }`: "where a value belongs",
		`mutation { a(x: [1, 2) }`:       `")" where a value belongs`,
		`mutation { a(x: {b 1}) }`:       `where ":" belongs`,
		"mutation { a(x: \"\xff\") }":    "not UTF-8",
		`query { a | b }`:                `"|" where a name belongs`,
	} {
		ops, err := Scan(doc)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Scan(%q) = %v, %v; want an error with %q", doc, ops, err, want)
		}
	}
}

// Nesting is bounded: a deep document is an error, not a deep stack.
func TestScanDepth(t *testing.T) {
	for _, doc := range []string{
		"query " + strings.Repeat("{ a ", 200) + strings.Repeat("}", 200),
		"query { a(x: " + strings.Repeat("[", 200) + strings.Repeat("]", 200) + ") }",
		"query { a(x: " + strings.Repeat("{b: ", 200) + "1" + strings.Repeat("}", 200) + ") }",
		"query Q($a: " + strings.Repeat("[", 200) + "Int" + strings.Repeat("]", 200) + ") { a }",
		"query { a(x: " + strings.Repeat("[", 1<<20) + ") }",
	} {
		if _, err := Scan(doc); err == nil || !strings.Contains(err.Error(), "nested deeper than") {
			t.Errorf("Scan of %d bytes nested: %v", len(doc), err)
		}
	}
	ok := "query " + strings.Repeat("{ a ", 100) + strings.Repeat("}", 100)
	if _, err := Scan(ok); err != nil {
		t.Errorf("100 levels: %v", err)
	}
}

func TestScanRequest(t *testing.T) {
	body := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	ok := map[string][]Operation{
		body(map[string]any{"query": ghCreatePR, "variables": map[string]any{"input": map[string]any{"title": "mutation { mergePullRequest }"}}}): {
			{Mutation, "PullRequestCreate", []string{"createPullRequest"}}},
		body(map[string]any{"query": ghMerge, "operationName": nil}):                           {{Mutation, "", []string{"mergePullRequest"}}},
		`{"operationName": "Q", "query": "query Q { viewer { login } }", "variables": null}`:   {{Query, "Q", []string{"viewer"}}},
		`{"qu\u0065ry": "{ viewer { login } }"}`:                                               {{Query, "", []string{"viewer"}}},
		`{"query": "{ viewer { login } }", "variables": {"t": "\ud83d\ude00 \\ud800 \u00e9"}}`: {{Query, "", []string{"viewer"}}},
	}
	for b, want := range ok {
		got, err := ScanRequest([]byte(b))
		if err != nil {
			t.Errorf("ScanRequest(%s): %v", b, err)
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("ScanRequest(%s) = %+v, want %+v", b, got, want)
		}
	}
	for b, want := range map[string]string{
		``:                     "not a JSON object",
		`[{"query": "{ a }"}]`: "not a JSON object",
		`"{ a }"`:              "not a JSON object",
		`{"query": "{ a }", "query": "mutation { b }"}`:          `the key "query" twice`,
		`{"query": "{ a }", "qu\u0065ry": "mutation { b }"}`:     `the key "query" twice`,
		`{"Query": "mutation { b }", "query": "{ a }"}`:          `the key "Query"`,
		`{"query": "{ a }", "extensions": {}}`:                   `the key "extensions"`,
		`{"variables": {}}`:                                      `no "query"`,
		`{"query": 1}`:                                           `"query" is not a string`,
		`{"query": "{ a }", "operationName": 1}`:                 `"operationName" is not a string`,
		`{"query": "{ a }"} {"query": "mutation { b }"}`:         "more after its JSON object",
		`{"query": "{ a }",}`:                                    "not JSON",
		`{"query": "{ a }"`:                                      "not JSON",
		`{"query": "mutation { a }"`:                             "not JSON",
		`{"query": "{ a } mutation"}`:                            `where "{" belongs`,
		`{"query\ud800": "mutation { b }", "query": "{ a }"}`:    "a lone surrogate escape",
		`{"query": "{ a }", "variables": {"x": "\uDC00"}}`:       "a lone surrogate escape",
		`{"query": "{ a }", "variables": {"x": "\ud800\u0041"}}`: "a lone surrogate escape",
		`{"query": "{ a }", "variables": {"x": "\ud800"}}`:       "a lone surrogate escape",
	} {
		ops, err := ScanRequest([]byte(b))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ScanRequest(%s) = %v, %v; want an error with %q", b, ops, err, want)
		}
	}
}
