package credswap

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// Swap returns a copy of h, the headers of a request to host (a name, a
// port and any case ignored) at u, with the placeholder of a secret bound
// to host replaced by its value where a credential goes, and only there:
//
//   - in Authorization and Proxy-Authorization, a value that is the
//     placeholder, "<scheme> <placeholder>", or Basic with the placeholder
//     as the user or the password (decoded, swapped, encoded again);
//   - in a header the secret names (Secret.Headers, e.g. x-api-key), a
//     value that is the placeholder or "<scheme> <placeholder>".
//
// A server may quote any other part of a request back (an error that
// repeats a header it did not expect, an echo endpoint, a page that shows
// the URL), and the guest would read the value there: so a placeholder
// anywhere else (another header, inside a longer value, the URL, a
// header's name) is refused, as is a placeholder of a secret not bound to
// host anywhere, and a header that would carry the real value of a secret
// not bound to host. The error (IsRefused) names the secret, the host and
// the place, never a placeholder or a value. h itself is not changed; u
// may be nil. names are the secrets it put in, sorted, for the proxy's
// log.
func (s *Set) Swap(host string, u *url.URL, h http.Header) (out http.Header, names []string, err error) {
	host = canonHost(host)
	if u != nil {
		if err := s.checkURL(host, u); err != nil {
			return nil, nil, err
		}
	}
	used := map[string]bool{}
	out = make(http.Header, len(h))
	for name, values := range h {
		at := place{header: name, part: "'s name"}
		for _, b := range s.secrets {
			if strings.Contains(name, b.Placeholder) {
				return nil, nil, s.refuse(b, host, at)
			}
		}
		if err := s.checkOut(host, name, at); err != nil {
			return nil, nil, err
		}
		swapped := make([]string, len(values))
		for i, v := range values {
			if swapped[i], err = s.swapValue(host, name, v, used); err != nil {
				return nil, nil, err
			}
		}
		out[name] = swapped
	}
	for n := range used {
		names = append(names, n)
	}
	slices.Sort(names)
	return out, names, nil
}

// Bound says whether a secret of the set is bound to host.
func (s *Set) Bound(host string) bool {
	host = canonHost(host)
	for _, b := range s.secrets {
		if b.hosts[host] {
			return true
		}
	}
	return false
}

// swapValue checks and swaps v, a value of header name, adding the names
// of the secrets it put in to used.
func (s *Set) swapValue(host, name, v string, used map[string]bool) (string, error) {
	at := place{header: name}
	if err := s.checkUnbound(host, v, at); err != nil {
		return "", err
	}
	out := v
	if scheme, token, ok := credential(v); ok {
		for _, b := range s.secrets {
			if b.hosts[host] && token == b.Placeholder && (isAuth(name) || b.headers[http.CanonicalHeaderKey(name)]) {
				out = scheme + b.Value
				used[b.Name] = true
				break
			}
		}
		if out == v && isAuth(name) && strings.EqualFold(strings.TrimSpace(scheme), "Basic") {
			var err error
			if out, err = s.swapBasic(host, scheme, token, at, used); err != nil {
				return "", err
			}
		}
	}
	if out == v {
		for _, b := range s.secrets {
			if b.hosts[host] && strings.Contains(v, b.Placeholder) {
				return "", s.misplaced(b, host, at)
			}
		}
	}
	return out, s.checkOut(host, out, at)
}

// credential splits a header value that has the shape of a credential,
// a token alone or "<scheme> <token>", into the scheme with the spaces
// after it ("" for a token alone) and the token.
func credential(v string) (scheme, token string, ok bool) {
	v = strings.Trim(v, " \t")
	if v == "" {
		return "", "", false
	}
	i := strings.IndexAny(v, " \t")
	if i < 0 {
		return "", v, true
	}
	token = strings.TrimLeft(v[i:], " \t")
	if strings.ContainsAny(token, " \t") {
		return "", "", false
	}
	return v[:len(v)-len(token)], token, true
}

// swapBasic swaps within the Basic credential cred (its base64), whose
// user or password may be a placeholder of host's secrets, whole. A
// credential that is not base64 is returned as it was.
func (s *Set) swapBasic(host, scheme, cred string, at place, used map[string]bool) (string, error) {
	orig := scheme + cred
	dec, err := base64.StdEncoding.DecodeString(cred)
	if err != nil {
		return orig, nil
	}
	in := place{header: at.header, part: "'s Basic credential"}
	if err := s.checkUnbound(host, string(dec), in); err != nil {
		return "", err
	}
	user, pass, _ := strings.Cut(string(dec), ":")
	swap := func(part string) string {
		for _, b := range s.secrets {
			if b.hosts[host] && part == b.Placeholder {
				used[b.Name] = true
				return b.Value
			}
		}
		return part
	}
	user, pass = swap(user), swap(pass)
	swapped := user + ":" + pass
	if !strings.Contains(string(dec), ":") {
		swapped = user
	}
	for _, b := range s.secrets {
		if b.hosts[host] && strings.Contains(swapped, b.Placeholder) {
			return "", s.misplaced(b, host, in)
		}
	}
	if err := s.checkOut(host, swapped, in); err != nil {
		return "", err
	}
	if swapped == string(dec) {
		return orig, nil
	}
	return scheme + base64.StdEncoding.EncodeToString([]byte(swapped)), nil
}

// checkUnbound refuses v if it carries a placeholder of a secret not bound
// to host.
func (s *Set) checkUnbound(host, v string, at place) error {
	for _, b := range s.secrets {
		if !b.hosts[host] && strings.Contains(v, b.Placeholder) {
			return s.refuse(b, host, at)
		}
	}
	return nil
}

// checkOut refuses a swapped v that still carries a placeholder of host's
// secrets or the value of a secret not bound to host.
func (s *Set) checkOut(host, v string, at place) error {
	for _, b := range s.secrets {
		if b.hosts[host] && strings.Contains(v, b.Placeholder) {
			return s.refusal("%s to %q would still carry secret %q's placeholder after the swap (hint: send the placeholder alone, not run into other text)", s.describe(at), host, b.Name)
		}
		if !b.hosts[host] && strings.Contains(v, b.Value) {
			return s.refusal("%s to %q would carry the value of secret %q, which is not bound to that host", s.describe(at), host, b.Name)
		}
	}
	return nil
}

// checkURL refuses u if it carries, as sent or unescaped, a placeholder:
// of a secret not bound to host, or of one bound to it (the value never
// goes into a URL).
func (s *Set) checkURL(host string, u *url.URL) error {
	raw := u.String()
	forms := []string{raw}
	if p, err := url.PathUnescape(raw); err == nil {
		forms = append(forms, p)
	}
	if q, err := url.QueryUnescape(raw); err == nil {
		forms = append(forms, q)
	}
	for _, f := range forms {
		if err := s.checkUnbound(host, f, place{}); err != nil {
			return err
		}
		for _, b := range s.secrets {
			if strings.Contains(f, b.Placeholder) {
				return s.misplaced(b, host, place{})
			}
		}
	}
	return nil
}

// refuse is the error for b's placeholder found where it may not go.
func (s *Set) refuse(b binding, host string, at place) error {
	bound := "no host"
	if len(b.Hosts) > 0 {
		bound = strings.Join(b.Hosts, ", ")
	}
	return s.refusal("%s to %q carries the placeholder of secret %q, which may only be sent to %s (hint: use it only with those hosts)", s.describe(at), host, b.Name, bound)
}

// misplaced is the error for the placeholder of b, a secret bound to
// host, found where no credential goes.
func (s *Set) misplaced(b binding, host string, at place) error {
	where := "Authorization, Proxy-Authorization"
	for _, h := range b.Headers {
		where += ", " + http.CanonicalHeaderKey(h)
	}
	return s.refusal("%s to %q carries the placeholder of secret %q where no credential goes: its value is put only in %s, as the whole value or after a scheme, since a server may send the rest of a request back (hint: send it there; `agent-vm secret set %s --header HEADER` names another header)", s.describe(at), host, b.Name, where, b.Name)
}

// place is where in a request a placeholder or value was found, put in
// words only when it goes into an error: header "" is the URL; part
// follows the header's name ("'s name", "'s Basic credential").
type place struct {
	header, part string
}

// describe says where at is for an error, not naming a header whose name
// holds a placeholder or a value.
func (s *Set) describe(at place) string {
	switch {
	case at.header == "":
		return "the URL"
	case s.holdsAny(at.header):
		return "a header" + at.part
	}
	return fmt.Sprintf("header %q%s", at.header, at.part)
}

// refusal makes a refusal's error. What the request brought (a header's
// name, the host) may hold a placeholder or, if the guest learnt one, a
// value: such an argument is replaced whole, and then any placeholder or
// value still in the message (formed across its parts, however unlikely)
// is cut out until none is left; each cut shortens the message, so this
// ends.
func (s *Set) refusal(format string, args ...any) error {
	for i, a := range args {
		if str, ok := a.(string); ok && s.holdsAny(str) {
			args[i] = "(hidden: it holds a credential)"
		}
	}
	msg := "request refused: " + fmt.Sprintf(format, args...)
	for s.holdsAny(msg) {
		for _, b := range s.secrets {
			msg = strings.ReplaceAll(msg, b.Value, "")
			msg = strings.ReplaceAll(msg, b.Placeholder, "")
		}
	}
	return refusedError(msg)
}

// holdsAny says whether str holds any secret's placeholder or value.
func (s *Set) holdsAny(str string) bool {
	for _, b := range s.secrets {
		if strings.Contains(str, b.Value) || strings.Contains(str, b.Placeholder) {
			return true
		}
	}
	return false
}

// isAuth says whether header name carries an auth scheme's credential.
func isAuth(name string) bool {
	return strings.EqualFold(name, "Authorization") || strings.EqualFold(name, "Proxy-Authorization")
}
