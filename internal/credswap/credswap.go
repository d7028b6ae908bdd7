// Package credswap swaps placeholder credentials for real ones in the
// headers of a request leaving a VM. The guest holds only placeholders
// (random, recognisable strings); the host holds each secret's real value
// and the hosts it is bound to. For a request to one of those hosts the
// egress proxy, which sees the request in clear, has Set.Swap put the
// real value where a credential goes and nowhere else: Authorization and
// Proxy-Authorization (the placeholder alone, after a scheme, or as a Basic
// credential's user or password) and the headers a secret names
// (x-api-key for Anthropic's key). A server may repeat any other part of a
// request in its answer, so a placeholder anywhere else is refused, as is
// a placeholder of a secret not bound to the request's host anywhere in
// its headers or URL; the error names the secret and the host.
//
// The swap happening only for bound hosts, in credential positions, and
// the checks on the output (no placeholder of the host's secrets is left
// in it, and no real value of a secret not bound to the host is in it) are
// what keep a secret; the refusals tell a confused or hostile agent early,
// and plainly, where the credential may go.
//
// Only whole placeholders within one header value are swapped: one split
// across two values or two headers does not match and goes out as it is
// (a placeholder is not secret). The URL is checked, never rewritten.
// Errors name a secret by its Name, never by its placeholder or value.
//
// It is pure and keeps no state beyond the Set it is given; it is apart
// from internal/egress because it is its own vocabulary (secrets,
// placeholders, bindings) with its own invariants and fuzz target, which
// egress will call on each request it terminates.
package credswap

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
)

// minPlaceholder is the shortest placeholder a Set takes: a shorter one
// would match text that is not a placeholder.
const minPlaceholder = 8

// Secret is one credential the host keeps for a VM.
type Secret struct {
	Name        string   // how messages name it, e.g. "GITHUB_TOKEN"
	Placeholder string   // what the guest holds instead of Value
	Value       string   // the real value: never printed, logged or put in an error
	Hosts       []string // the hosts Value may be sent to (names, matched exactly, any case)
	// Headers are the request headers, besides Authorization and
	// Proxy-Authorization, that carry it (any case), e.g. x-api-key.
	Headers []string
}

// Format prints a Secret without its placeholder or value, whatever the
// verb, so that no %v or %+v of a Secret (or of a struct holding one)
// can leak them.
func (s Secret) Format(f fmt.State, _ rune) {
	_, _ = io.WriteString(f, "secret "+fmt.Sprintf("%q", s.Name)+" for "+strings.Join(s.Hosts, ", "))
}

// Set is the secrets of one VM, checked and ready to swap.
type Set struct {
	secrets []binding
}

// Format prints a Set as its secrets' names and hosts, never their
// placeholders or values (fmt would print its unexported fields raw).
func (s Set) Format(f fmt.State, _ rune) {
	parts := make([]string, len(s.secrets))
	for i, b := range s.secrets {
		parts[i] = fmt.Sprint(b.Secret)
	}
	_, _ = io.WriteString(f, "["+strings.Join(parts, "; ")+"]")
}

// isToken says whether h is a header field name: RFC 9110's token.
func isToken(h string) bool {
	if h == "" {
		return false
	}
	for _, c := range h {
		if c > 0x7e || c <= ' ' || strings.ContainsRune(`"(),/:;<=>?@[\]{}`, c) {
			return false
		}
	}
	return true
}

// binding is a secret with its hosts in canonical form.
type binding struct {
	Secret
	hosts   map[string]bool
	headers map[string]bool // canonical keys (http.CanonicalHeaderKey)
}

// New checks secrets and makes a Set of them: each has a name and a value
// and a placeholder of at least 8 bytes; no placeholder is within another
// or within a value (a swap could then not be undone by a reader, or
// would put a placeholder back).
func New(secrets []Secret) (*Set, error) {
	s := &Set{}
	names := map[string]bool{}
	for i, sec := range secrets {
		if sec.Name == "" {
			return nil, fmt.Errorf("secret %d has no name (hint: give every secret a name)", i+1)
		}
		if len(sec.Placeholder) < minPlaceholder {
			return nil, fmt.Errorf("secret %q: its placeholder is shorter than %d bytes (hint: make placeholders with the usual prefix and random part)", sec.Name, minPlaceholder)
		}
		if sec.Value == "" {
			return nil, fmt.Errorf("secret %q has no value (hint: set its value on the host)", sec.Name)
		}
		if names[sec.Name] {
			return nil, fmt.Errorf("secret %q is listed twice (hint: give each secret its own name)", sec.Name)
		}
		names[sec.Name] = true
		for _, other := range secrets {
			if strings.Contains(other.Value, sec.Placeholder) {
				return nil, fmt.Errorf("secret %q's value contains secret %q's placeholder (hint: make new placeholders)", other.Name, sec.Name)
			}
			if other.Name != sec.Name && strings.Contains(other.Placeholder, sec.Placeholder) {
				return nil, fmt.Errorf("secret %q's placeholder contains secret %q's (hint: make new placeholders)", other.Name, sec.Name)
			}
		}
		b := binding{Secret: sec, hosts: map[string]bool{}, headers: map[string]bool{}}
		for _, h := range sec.Hosts {
			b.hosts[canonHost(h)] = true
		}
		for _, h := range sec.Headers {
			if !isToken(h) {
				return nil, fmt.Errorf("secret %q: %q is not a header name (hint: a name such as x-api-key)", sec.Name, h)
			}
			b.headers[http.CanonicalHeaderKey(h)] = true
		}
		s.secrets = append(s.secrets, b)
	}
	return s, nil
}

// canonHost is host as bindings compare it: lower case, without a port
// or a final dot.
func canonHost(host string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	return strings.TrimSuffix(strings.ToLower(host), ".")
}

// refusedError is Swap's refusal of a request: its whole message, made by
// Set.refusal so that it holds no placeholder and no value.
type refusedError string

func (e refusedError) Error() string { return string(e) }

// IsRefused says whether err is Swap's refusal of a request (rather than
// a fault of the caller's).
func IsRefused(err error) bool {
	var r refusedError
	return errors.As(err, &r)
}
