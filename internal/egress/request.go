package egress

import (
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strings"
)

// Request rules judge each request the proxy reads, those in the tunnels
// it intercepts (the hosts a secret is bound to: Interceptor); a tunnel
// it does not intercept is opaque and only its host is judged (Decide).
//
// A rule is a verdict and a pattern, written "allow METHOD host/path" or
// "deny METHOD host/path":
//   - METHOD is an HTTP method (GET, HEAD, POST, PUT, PATCH, DELETE,
//     OPTIONS) or * for any;
//   - host is a host name, matched exactly (no wildcard, no IP address,
//     no port);
//   - path is segments separated by /: a literal segment matches itself,
//     * matches exactly one segment, a final ** matches whatever follows
//     (zero or more segments). The request's query string is not
//     matched.
//
// An allow rule may add a GraphQL condition for POSTs of GraphQL over
// HTTP: "allow POST api.github.com/graphql graphql:createPullRequest,addComment"
// matches a request only if its JSON body is GraphQL the proxy reads with
// certainty (internal/gqlscan) whose operations are queries, or
// mutations whose root fields are all on the list ("graphql" alone:
// queries only).
//
// A policy's rules are tried in order and the first that matches
// decides. An allow rule so only matters as an exception to a deny rule
// after it; a request no rule matches is allowed, so a host without
// rules is served as before. On a host that has rules, a request whose
// path the rules cannot judge plainly (a . or .. segment, an empty
// segment, an escape escaped again, a method override header) is
// refused. A deny rule matches the method and its literal segments
// regardless of case, an allow rule only as written: a server that
// ignores case can be used to slip past neither.

// Methods a request rule names.
var ruleMethods = []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}

// RequestPattern is the requests a rule is about: "METHOD host/path",
// and for an allow rule an optional GraphQL condition.
type RequestPattern struct {
	Method string // upper case, or "*"
	Host   string // a host name, lower case
	Path   string // "/" and segments; "*", a final "**"
	// GraphQL: the pattern matches GraphQL requests whose operations are
	// queries, or mutations of the root fields Mutations lists.
	GraphQL   bool
	Mutations []string
}

// RequestRule is a verdict on the requests a pattern matches.
type RequestRule struct {
	Allow bool
	RequestPattern
}

// The words of a rule's verdict.
const (
	verdictAllow = "allow"
	verdictDeny  = "deny"
)

var (
	segmentRE = regexp.MustCompile(`^[A-Za-z0-9._~!$&()+,;=:@-]+$`)
	gqlNameRE = regexp.MustCompile(`^[_A-Za-z][_0-9A-Za-z]*$`)
)

// ParseRequestPattern reads a pattern as the user writes it:
// "METHOD host/path", then "graphql" or "graphql:FIELD,FIELD..." for a
// POST of GraphQL. Its errors quote s and say how to write it.
func ParseRequestPattern(s string) (RequestPattern, error) {
	bad := func(format string, args ...any) (RequestPattern, error) {
		return RequestPattern{}, fmt.Errorf("request rule %q: %s", s, fmt.Sprintf(format, args...))
	}
	f := strings.Fields(s)
	switch {
	case len(f) == 0:
		return bad("empty (hint: METHOD host/path, e.g. 'POST api.github.com/repos/o/r/pulls')")
	case len(f) == 1:
		return bad("a rule is METHOD host/path (hint: e.g. 'GET %s')", strings.TrimPrefix(f[0], "/"))
	case len(f) > 3:
		return bad("more words than METHOD host/path and a graphql condition")
	}
	var pt RequestPattern
	pt.Method = strings.ToUpper(f[0])
	if pt.Method != "*" && !slices.Contains(ruleMethods, pt.Method) {
		return bad("%q is not an HTTP method (hint: %s, or * for any)", f[0], strings.Join(ruleMethods, ", "))
	}
	hostpath := f[1]
	if strings.Contains(hostpath, "://") {
		return bad("a rule names no scheme (hint: api.github.com/x, not https://api.github.com/x)")
	}
	host, path, ok := strings.Cut(hostpath, "/")
	if host == "" {
		return bad("no host before the path (hint: %s api.github.com/%s)", pt.Method, path)
	}
	if !ok {
		return bad("no path after the host (hint: %s %s/** for every path)", pt.Method, host)
	}
	pt.Host, pt.Path = normalize(host), "/"+path
	if _, err := netip.ParseAddr(pt.Host); err == nil {
		return bad("%s is an IP address: a rule names the host a secret is bound to, whose requests the proxy reads (hint: its name, e.g. api.github.com)", host)
	}
	switch {
	case strings.Contains(pt.Host, "*"):
		return bad("a rule's host is exact: no wildcard in %s", host)
	case strings.Contains(pt.Host, ":"):
		return bad("a rule's host has no port: %s", host)
	case len(pt.Host) > 253 || !validName(pt.Host):
		return bad("%q is not a host name", host)
	}
	if err := checkRulePath(pt.Path); err != nil {
		return bad("%v", err)
	}
	if len(f) == 3 {
		cond, list, hasList := strings.Cut(f[2], ":")
		if cond != "graphql" {
			return bad("%q is not a condition (hint: graphql, or graphql:FIELD,... for the mutations allowed)", f[2])
		}
		if pt.Method != http.MethodPost {
			return bad("a graphql condition reads a POST's body (hint: POST %s%s %s)", pt.Host, pt.Path, f[2])
		}
		pt.GraphQL = true
		if hasList {
			for _, m := range strings.Split(list, ",") {
				if !gqlNameRE.MatchString(m) {
					return bad("%q is not the name of a GraphQL field (hint: graphql:createPullRequest,addComment)", m)
				}
				if !slices.Contains(pt.Mutations, m) {
					pt.Mutations = append(pt.Mutations, m)
				}
			}
		}
	}
	return pt, nil
}

// checkRulePath checks a rule's path: "/", or segments each "*", a
// literal, or a final "**".
func checkRulePath(path string) error {
	if path == "/" {
		return nil
	}
	segs := strings.Split(path[1:], "/")
	for i, seg := range segs {
		switch {
		case seg == "":
			return fmt.Errorf("an empty segment in %s (hint: no // and no final /)", path)
		case seg == "**" && i < len(segs)-1:
			return fmt.Errorf("** stands for the rest of the path, so it ends it (hint: * for one segment)")
		case seg == "*" || seg == "**":
		case seg == "." || seg == "..":
			return fmt.Errorf("a %s segment in %s", seg, path)
		case strings.Contains(seg, "*"):
			return fmt.Errorf("%q: * stands for a whole segment (hint: /*/)", seg)
		case !segmentRE.MatchString(seg):
			return fmt.Errorf("%q: a segment is *, ** or letters, digits and -._~!$&()+,;=:@ (written unescaped)", seg)
		}
	}
	return nil
}

// String is the pattern as ParseRequestPattern reads it.
func (pt RequestPattern) String() string {
	s := pt.Method + " " + pt.Host + pt.Path
	if pt.GraphQL {
		s += " graphql"
		if len(pt.Mutations) > 0 {
			s += ":" + strings.Join(pt.Mutations, ",")
		}
	}
	return s
}

// NewRequestRule is the rule of verdict allow on the pattern s
// (ParseRequestPattern). A deny rule takes no GraphQL condition.
func NewRequestRule(allow bool, s string) (RequestRule, error) {
	pt, err := ParseRequestPattern(s)
	if err != nil {
		return RequestRule{}, err
	}
	if !allow && pt.GraphQL {
		return RequestRule{}, fmt.Errorf("request rule %q: a deny rule has no graphql condition (hint: deny '%s %s%s' refuses every request there)", s, pt.Method, pt.Host, pt.Path)
	}
	return RequestRule{Allow: allow, RequestPattern: pt}, nil
}

// ParseRequestRule reads "allow PATTERN" or "deny PATTERN" (String).
func ParseRequestRule(s string) (RequestRule, error) {
	verdict, pattern, _ := strings.Cut(strings.TrimSpace(s), " ")
	switch verdict {
	case verdictAllow, verdictDeny:
		return NewRequestRule(verdict == verdictAllow, pattern)
	}
	return RequestRule{}, fmt.Errorf("%q is not a request rule (hint: allow or deny, then METHOD host/path)", s)
}

// String is "allow PATTERN" or "deny PATTERN".
func (r RequestRule) String() string {
	if r.Allow {
		return verdictAllow + " " + r.RequestPattern.String()
	}
	return verdictDeny + " " + r.RequestPattern.String()
}

// MarshalText writes a rule as String does: the policy file keeps rules
// as strings.
func (r RequestRule) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// UnmarshalText reads a rule as ParseRequestRule does.
func (r *RequestRule) UnmarshalText(b []byte) error {
	rule, err := ParseRequestRule(string(b))
	if err != nil {
		return err
	}
	*r = rule
	return nil
}

// matches says whether the pattern's method, host and path match a
// request's (its path as requestPath splits it); fold: the method and the
// literal segments match regardless of case.
func (pt RequestPattern) matches(method, host string, segs []string, fold bool) bool {
	if host != pt.Host || pt.Method != "*" && method != pt.Method && !(fold && strings.EqualFold(method, pt.Method)) {
		return false
	}
	var pat []string
	if pt.Path != "/" {
		pat = strings.Split(pt.Path[1:], "/")
	}
	for i, p := range pat {
		if p == "**" {
			return true
		}
		if i == len(segs) {
			return false
		}
		switch s := segs[i]; {
		case p == "*":
			if s == "" || strings.ContainsAny(s, `/\`) {
				return false
			}
		case p != s && !(fold && strings.EqualFold(p, s)):
			return false
		}
	}
	return len(pat) == len(segs)
}

// methodOverrides are the headers with which some servers take a POST
// for another method.
var methodOverrides = []string{"X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override"}

// requestPath splits a request's path into its segments, each
// unescaped ("/" is none, a final "/" an empty last one); odd says why
// the rules cannot judge it, as a server might read it as another path
// or the request as another method.
func requestPath(req *http.Request) (segs []string, odd string) {
	for _, h := range methodOverrides {
		if _, ok := req.Header[http.CanonicalHeaderKey(h)]; ok {
			return nil, "a request with the header " + h
		}
	}
	if q := strings.ReplaceAll(strings.ToLower(req.URL.RawQuery), "%5f", "_"); strings.Contains(q, "_method") {
		return nil, "a request with _method in its query"
	}
	p := req.URL.EscapedPath()
	if !strings.HasPrefix(p, "/") {
		return nil, "a request whose path does not begin with /"
	}
	if p == "/" {
		return nil, ""
	}
	raw := strings.Split(p[1:], "/")
	for i, r := range raw {
		s, err := url.PathUnescape(r)
		switch {
		case err != nil:
			return nil, "a path with a broken %-escape"
		case r == "" && i < len(raw)-1:
			return nil, "a path with an empty segment (//)"
		case dotSegment(s):
			return nil, "a path with a . or .. segment"
		case escapedAgain(s):
			return nil, "a path with an escape escaped again (%25)"
		}
		segs = append(segs, s)
	}
	return segs, ""
}

// dotSegment says whether an unescaped segment is, or holds, a "." or
// ".." segment (an escaped slash or a backslash made it one segment).
func dotSegment(s string) bool {
	for _, part := range strings.FieldsFunc(s, func(r rune) bool { return r == '/' || r == '\\' }) {
		if part == "." || part == ".." {
			return true
		}
	}
	return false
}

// escapedAgain says whether an unescaped segment still escapes a dot, a
// slash or a backslash: a server that unescapes twice reads another path.
func escapedAgain(s string) bool {
	s = strings.ToLower(s)
	return strings.Contains(s, "%2e") || strings.Contains(s, "%2f") || strings.Contains(s, "%5c")
}

// RequestDecision is the request rules' answer for one request.
type RequestDecision struct {
	Allowed bool
	// Rule is the rule that decided ("" when none matched), or why the
	// rules could not judge the request.
	Rule string
	// Note says why a GraphQL rule before Rule did not match.
	Note string
	// Fix is the pattern of a rule that would allow the request, "" when
	// none would.
	Fix string
}

// DecideRequest applies the rules of p for host (as normalize leaves it)
// to req, an intercepted request. A GraphQL rule whose method, host and
// path match reads req's body (at most maxInspectedBody), and puts what
// it read back in front of the rest, for the host to get.
func (p Policy) DecideRequest(host string, req *http.Request) RequestDecision {
	var rules []RequestRule
	for _, r := range p.Requests {
		if r.Host == host {
			rules = append(rules, r)
		}
	}
	if len(rules) == 0 {
		return RequestDecision{Allowed: true}
	}
	segs, odd := requestPath(req)
	if odd != "" {
		return RequestDecision{Rule: odd + ", which the request rules do not judge"}
	}
	fix := RequestPattern{Method: req.Method, Host: host, Path: req.URL.Path}
	var gql *graphqlRead
	var note string
	for _, r := range rules {
		if !r.matches(req.Method, host, segs, !r.Allow) {
			continue
		}
		if r.GraphQL {
			if gql == nil {
				gql = readGraphQL(req)
			}
			if why, cond := r.admits(gql); why != "" {
				note = fmt.Sprintf("%s did not match: %s", r, why)
				fix.GraphQL, fix.Mutations = cond != nil, cond
				continue
			}
		}
		d := RequestDecision{Allowed: r.Allow, Rule: r.String(), Note: note}
		if pt, err := ParseRequestPattern(fix.String()); !d.Allowed && err == nil && pt.matches(req.Method, host, segs, false) {
			d.Fix = pt.String()
		}
		return d
	}
	return RequestDecision{Allowed: true}
}
