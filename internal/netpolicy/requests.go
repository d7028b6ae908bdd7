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

// githubPatterns are the default request rules for api.github.com of a
// workspace whose upstream is on github.com, repo being its path
// ("/owner/name"; "" for none): GitHub's API may be read, the upstream's
// pull requests and issues opened and commented on (repo's REST paths,
// GitHubMutations in GraphQL), and nothing else written. They apply when a
// secret is bound to api.github.com, the one way the proxy reads its
// requests.
func githubPatterns(repo string) []string {
	return append(forgeAPI(githubAPI, "", "/graphql", repo), "deny * "+githubAPI+"/**")
}

// forgeAPI are the patterns of GitHub's API rules on host, its REST API
// under rest ("" on api.github.com, /api/v3 on GitHub Enterprise) and its
// GraphQL at graphql, for the repository at repo: GraphQL queries and
// GitHubMutations, reads, and the repository's pull requests, issues and
// their comments. The caller closes the host after them.
func forgeAPI(host, rest, graphql, repo string) []string {
	patterns := []string{
		"allow POST " + host + graphql + " graphql:" + strings.Join(GitHubMutations, ","),
		"deny * " + host + graphql,
		"allow GET " + host + "/**",
		"allow HEAD " + host + "/**",
	}
	if parts := strings.Split(strings.Trim(repo, "/"), "/"); len(parts) == 2 {
		r := host + rest + "/repos/" + parts[0] + "/" + parts[1]
		patterns = append(patterns,
			"allow POST "+r+"/pulls",
			"allow POST "+r+"/issues",
			"allow POST "+r+"/issues/*/comments",
			"allow POST "+r+"/pulls/*/comments")
	}
	return patterns
}

// agentAPIs are the hosts of the agents' own APIs (their keys' default
// hosts, internal/secret): there a POST is the agent's work, so they are
// not closed to writes.
var agentAPIs = []string{"api.anthropic.com", "api.openai.com", "generativelanguage.googleapis.com"}

// closedRules close host, a host a secret is bound to, to writes: it may
// be read (GET, HEAD, OPTIONS), and when it holds the upstream repository
// at repo ("" when not), fetched from and pushed to with git's smart HTTP
// (each push read by the proxy: only the VM's branch) and Git LFS, and
// any owner/name repository there fetched from; any other request is
// refused, and the refusal names the rule that would allow it.
func closedRules(host, repo string) []string {
	patterns := []string{"allow GET " + host + "/**", "allow HEAD " + host + "/**", "allow OPTIONS " + host + "/**"}
	if repo != "" {
		for _, p := range []string{repo, repo + ".git"} {
			patterns = append(patterns, "allow POST "+host+p+"/git-upload-pack", "allow POST "+host+p+"/git-receive-pack",
				// Git LFS: its batch API (downloads and uploads of
				// objects, which no ref names) and a push's lock check.
				"allow POST "+host+p+"/info/lfs/objects/batch", "allow POST "+host+p+"/info/lfs/locks/verify")
		}
		patterns = append(patterns, "allow POST "+host+"/*/*/git-upload-pack")
	}
	return append(patterns, "deny * "+host+"/**")
}

// parseRules are the rules of patterns; a pattern that makes no rule (a
// repository whose name is no segment) is left out, so what is left
// refuses.
func parseRules(patterns []string) []egress.RequestRule {
	var out []egress.RequestRule
	for _, s := range patterns {
		if rule, err := egress.ParseRequestRule(s); err == nil {
			out = append(out, rule)
		}
	}
	return out
}

// defaultRequests are the request rules agent-vm adds for r's workspace.
// An upstream on github.com gets githubPatterns (api.github.com); one on
// gitlab.com GraphQL queries; one on another host a secret is bound to
// GitHub Enterprise's (its API under /api/v3 and /api/graphql on that
// host; on another forge they match nothing). Then
// each host a secret is bound to is closed to writes (closedRules),
// those whose work is a POST (agentAPIs) and api.github.com (closed
// already) aside: a host the proxy puts a credential in is written to
// only where a rule allows it.
func defaultRequests(r *state.Record) []egress.RequestRule {
	var patterns []string
	rem, ok := gitws.ParseRemote(r.Git.UpstreamURL)
	upstreamHost := ""
	if ok {
		upstreamHost = rem.Host
		if rem.Host == "github.com" {
			patterns = append(patterns, githubPatterns(rem.Path)...)
		} else if rem.Host == "gitlab.com" {
			// GitLab's GraphQL may be queried; its REST API names a
			// project by its escaped path, which no rule's segment
			// matches, so its writes wait for rules of the user's
			// (a project's number: POST gitlab.com/api/v4/projects/ID/merge_requests).
			patterns = append(patterns, "allow POST gitlab.com/api/graphql graphql", "deny * gitlab.com/api/graphql")
		} else if slices.Contains(r.SecretHosts, rem.Host) {
			patterns = append(patterns, forgeAPI(rem.Host, "/api/v3", "/api/graphql", rem.Path)...)
		}
	}
	if upstreamHost != "github.com" && slices.Contains(r.SecretHosts, githubAPI) {
		// A GitHub token with the upstream elsewhere: GitHub is read
		// (gh reads through GraphQL queries too), and written to as the
		// defaults allow, no repository's REST paths among them.
		patterns = append(patterns, githubPatterns("")...)
	}
	hosts := slices.Clone(r.SecretHosts)
	slices.Sort(hosts)
	for _, h := range slices.Compact(hosts) {
		if h == githubAPI || slices.Contains(agentAPIs, h) {
			continue
		}
		repo := ""
		if h == upstreamHost {
			repo = rem.Path
		}
		patterns = append(patterns, closedRules(h, repo)...)
	}
	return parseRules(patterns)
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

// repoRequests are r's repository's request rules (state.Net.Repo), in
// the file's order.
func repoRequests(r *state.Record) []egress.RequestRule {
	if r.Net == nil || r.Net.Repo == nil {
		return nil
	}
	var out []egress.RequestRule
	for _, s := range r.Net.Repo.Requests {
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
	// Repository: from the repository's policy file.
	Repository bool `json:"repository,omitempty"`
}

// requestInfo lists r's request rules in force, in order.
func requestInfo(r *state.Record) []RequestRule {
	var out []RequestRule
	for _, rule := range userRequests(r) {
		out = append(out, RequestRule{Rule: rule.String()})
	}
	for _, rule := range repoRequests(r) {
		out = append(out, RequestRule{Rule: rule.String(), Repository: true})
	}
	for _, rule := range defaultRequests(r) {
		out = append(out, RequestRule{Rule: rule.String(), Default: true})
	}
	return out
}
