package netpolicy

import (
	"slices"
	"strings"

	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/gitws"
	"github.com/agent-vm/agent-vm/internal/state"
)

// GitHubMutations are the GraphQL mutations the GitHub defaults allow:
// opening a pull request (`gh pr create`) and commenting (`gh pr
// comment`, `gh issue comment`). A mutation names what it changes by the
// node IDs in its variables, which the proxy does not resolve, so unlike
// the REST rules these are not held to the upstream repository: the list
// keeps to changes that are seen and undone easily. Merging
// (mergePullRequest), editing or closing (updatePullRequest), reviews
// (addPullRequestReview, which can approve) and the rest are refused.
var GitHubMutations = []string{"createPullRequest", "addComment"}

// githubAPI is the host GitHub's REST and GraphQL APIs answer on.
const githubAPI = "api.github.com"

// githubRules are the default request rules of a workspace whose upstream
// is on github.com, repo being its path ("/owner/name"): GitHub's API may
// be read, the upstream's pull requests and issues opened and commented
// on (repo's REST paths, GitHubMutations in GraphQL), and nothing else
// written. They apply when a secret is bound to api.github.com, the one
// way the proxy reads its requests.
func githubRules(repo string) []egress.RequestRule {
	h := githubAPI
	patterns := []string{
		"allow POST " + h + "/graphql graphql:" + strings.Join(GitHubMutations, ","),
		"deny * " + h + "/graphql",
		"allow GET " + h + "/**",
		"allow HEAD " + h + "/**",
	}
	if parts := strings.Split(strings.Trim(repo, "/"), "/"); len(parts) == 2 {
		r := h + "/repos/" + parts[0] + "/" + parts[1]
		patterns = append(patterns,
			"allow POST "+r+"/pulls",
			"allow POST "+r+"/issues",
			"allow POST "+r+"/issues/*/comments",
			"allow POST "+r+"/pulls/*/comments")
	}
	patterns = append(patterns, "deny * "+h+"/**")
	var out []egress.RequestRule
	for _, s := range patterns {
		// A repository whose name makes no rule gets no rule that
		// allows: what is left refuses.
		if rule, err := egress.ParseRequestRule(s); err == nil {
			out = append(out, rule)
		}
	}
	return out
}

// defaultRequests are the request rules agent-vm adds for r's workspace:
// githubRules when its upstream is on github.com.
func defaultRequests(r *state.Record) []egress.RequestRule {
	rem, ok := gitws.ParseRemote(r.Git.UpstreamURL)
	if !ok || rem.Host != "github.com" {
		return nil
	}
	return githubRules(rem.Path)
}

// userRequests are the request rules the user added to r, newest first.
// One the record holds but this agent-vm cannot read is left out.
func userRequests(r *state.Record) []egress.RequestRule {
	if r.Net == nil {
		return nil
	}
	var out []egress.RequestRule
	for _, s := range r.Net.Requests {
		if rule, err := egress.ParseRequestRule(s); err == nil {
			out = append(out, rule)
		}
	}
	return out
}

// addRequests puts rules before the user's others (the newest are tried
// first), in their order; a rule of the same pattern is replaced.
func addRequests(n *state.Net, rules []egress.RequestRule) {
	var added []string
	for _, rule := range rules {
		same := func(s string) bool {
			old, err := egress.ParseRequestRule(s)
			return err == nil && old.RequestPattern.String() == rule.RequestPattern.String()
		}
		n.Requests = slices.DeleteFunc(n.Requests, same)
		added = append(slices.DeleteFunc(added, same), rule.String())
	}
	n.Requests = append(added, n.Requests...)
}

// isRequestRule says whether a pattern given to `net allow|deny` is a
// request rule ("METHOD host/path"), not a destination: it has a space.
func isRequestRule(pattern string) bool {
	return strings.ContainsAny(strings.TrimSpace(pattern), " \t")
}

// RequestRule is a request rule as `net show` lists it.
type RequestRule struct {
	Rule string `json:"rule"` // "allow|deny METHOD host/path"
	// Default: one of agent-vm's rules (the upstream is on GitHub), not
	// one the user added.
	Default bool `json:"default,omitempty"`
}

// requestInfo lists r's request rules in force, in order.
func requestInfo(r *state.Record) []RequestRule {
	var out []RequestRule
	for _, rule := range userRequests(r) {
		out = append(out, RequestRule{Rule: rule.String()})
	}
	for _, rule := range defaultRequests(r) {
		out = append(out, RequestRule{Rule: rule.String(), Default: true})
	}
	return out
}
