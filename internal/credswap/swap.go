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
// port and any case ignored) at u, with the placeholder of every secret
// bound to host replaced by its value in every header value, and inside
// an Authorization or Proxy-Authorization Basic credential (decoded,
// swapped in user and password, encoded again). h itself is not changed.
//
// It refuses the request (an error IsRefused knows, naming the secret
// and the host) when a placeholder of a secret not bound to host is in a
// header value or name, in a Basic credential, or in u (as sent or
// unescaped); when any placeholder is in a header name; and, after the
// swap, when a header would carry a placeholder of host's secrets or the
// real value of a secret not bound to host (text around a swapped value
// can only form one if made to: refused rather than sent). u may be nil.
// names are the secrets it put in, sorted, for the proxy's log.
func (s *Set) Swap(host string, u *url.URL, h http.Header) (out http.Header, names []string, err error) {
	host = canonHost(host)
	if u != nil {
		if err := s.checkURL(host, u); err != nil {
			return nil, nil, err
		}
	}
	used := map[string]bool{}
	out, err = s.swap(host, h, used)
	if err != nil {
		return nil, nil, err
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

// swap is Swap of the headers, adding the names of the secrets it put in
// to used.
func (s *Set) swap(host string, h http.Header, used map[string]bool) (http.Header, error) {
	out := make(http.Header, len(h))
	for name, values := range h {
		at := place{header: name}
		for _, b := range s.secrets {
			if strings.Contains(name, b.Placeholder) {
				return nil, s.refuse(b, host, place{header: name, part: "'s name"})
			}
		}
		if err := s.checkOut(host, name, place{header: name, part: "'s name"}); err != nil {
			return nil, err
		}
		swapped := make([]string, len(values))
		for i, v := range values {
			sv, err := s.swapValue(host, v, at, used)
			if err != nil {
				return nil, err
			}
			if isAuth(name) {
				if sv, err = s.swapBasic(host, sv, at, used); err != nil {
					return nil, err
				}
			}
			swapped[i] = sv
		}
		out[name] = swapped
	}
	return out, nil
}

// swapValue checks and swaps one header value (or a decoded credential).
func (s *Set) swapValue(host, v string, at place, used map[string]bool) (string, error) {
	if err := s.checkUnbound(host, v, at); err != nil {
		return "", err
	}
	for _, b := range s.secrets {
		if b.hosts[host] && strings.Contains(v, b.Placeholder) {
			v = strings.ReplaceAll(v, b.Placeholder, b.Value)
			used[b.Name] = true
		}
	}
	return v, s.checkOut(host, v, at)
}

// swapBasic swaps within the credential of an "Basic <base64>" value; any
// other value (another scheme, or not base64) is returned as it is.
func (s *Set) swapBasic(host, v string, at place, used map[string]bool) (string, error) {
	scheme, cred, ok := strings.Cut(strings.TrimLeft(v, " "), " ")
	if !ok || !strings.EqualFold(scheme, "Basic") {
		return v, nil
	}
	cred = strings.Trim(cred, " ")
	dec, err := base64.StdEncoding.DecodeString(cred)
	if err != nil {
		return v, nil
	}
	swapped, err := s.swapValue(host, string(dec), place{header: at.header, part: "'s Basic credential"}, used)
	if err != nil {
		return "", err
	}
	if swapped == string(dec) {
		return v, nil
	}
	out := scheme + " " + base64.StdEncoding.EncodeToString([]byte(swapped))
	return out, s.checkOut(host, out, at)
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

// checkURL refuses u if it carries, as sent or unescaped, a placeholder
// of a secret not bound to host.
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
