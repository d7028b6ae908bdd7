// Package secret is the host's store of the credentials agents use (API
// keys, git hosts' tokens), kept so that no guest ever holds one: a VM
// sees a placeholder in its environment instead (Placeholder), and its
// egress proxy puts the value in place of the placeholder on a request
// to a host the secret is bound to, and nowhere else.
//
// Each secret is a file NAME.json, 0600, in a 0700 directory of the
// user's configuration directory (hostdir.Table.Secrets), never under a
// VM's directory: its name, the hosts it is bound to, the VM it is for
// (none: every VM) and its value. Writes are atomic (internal/atomicfile),
// so a failed or interrupted `secret set` leaves the old secret or none.
//
// A value is a Value, whose every printed form (fmt's verbs, JSON, hclog)
// is "[redacted]": a Secret or a Value that reaches a log line or an error
// by mistake shows no credential. Reveal is the one way to the value, for
// the proxy.
package secret

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/agent-vm/agent-vm/internal/atomicfile"
	"github.com/agent-vm/agent-vm/internal/hostdir"
)

// Value is a secret's value. It prints as "[redacted]" however it is
// printed; Reveal gives the value.
type Value struct{ v string }

const redacted = "[redacted]"

// Reveal is the value itself, for the proxy that sends it to the secret's
// hosts; nothing else should call it.
func (v Value) Reveal() string { return v.v }

// String, GoString and Format keep the value out of every printed form.
func (v Value) String() string               { return redacted }
func (v Value) GoString() string             { return redacted }
func (v Value) Format(f fmt.State, _ rune)   { io.WriteString(f, redacted) }
func (v Value) MarshalJSON() ([]byte, error) { return json.Marshal(redacted) }

// Secret is one stored secret.
type Secret struct {
	Name string `json:"name"`
	// Hosts are the DNS names the value is sent to (exact names: a
	// secret bound to github.com is not sent to gist.github.com).
	Hosts []string `json:"hosts"`
	// Headers are the request headers, besides Authorization and
	// Proxy-Authorization, in which the value is sent (lower case), as
	// `secret set --header` gave them; Carriers adds a well-known name's.
	Headers []string `json:"headers,omitempty"`
	// VM is the id of the one VM the secret is for (state.Record.ID);
	// "" is every VM.
	VM    string `json:"vm,omitempty"`
	Value Value  `json:"value"`
}

// file is a secret as its file holds it: the one place the value is
// written out.
type file struct {
	Name    string   `json:"name"`
	Hosts   []string `json:"hosts"`
	Headers []string `json:"headers,omitempty"`
	VM      string   `json:"vm,omitempty"`
	Value   string   `json:"value"`
}

// DefaultHosts are the hosts of the well-known names, used when `secret
// set` names no host: each agent's API, and GitHub's git and API hosts
// for its tokens.
var defaultHosts = map[string][]string{
	"ANTHROPIC_API_KEY": {"api.anthropic.com"},
	// `claude setup-token`'s token, which Claude Code sends as a bearer
	// token to the same API.
	"CLAUDE_CODE_OAUTH_TOKEN": {"api.anthropic.com"},
	"OPENAI_API_KEY":          {"api.openai.com"},
	"GEMINI_API_KEY":          {"generativelanguage.googleapis.com"},
	"GH_TOKEN":                {"github.com", "api.github.com"},
	"GITHUB_TOKEN":            {"github.com", "api.github.com"},
}

// DefaultHosts are the hosts a well-known secret name is bound to when
// no host is given; nil for other names.
func DefaultHosts(name string) []string { return slices.Clone(defaultHosts[name]) }

// Hosts are the hosts the value of the secret called name is sent to:
// those given, checked (CheckHost) and in canonical form, else the name's
// DefaultHosts; none when neither names any.
func Hosts(name string, given []string) ([]string, error) {
	var hosts []string
	for _, h := range given {
		c, err := CheckHost(h)
		if err != nil {
			return nil, err
		}
		if !slices.Contains(hosts, c) {
			hosts = append(hosts, c)
		}
	}
	if len(hosts) == 0 {
		hosts = DefaultHosts(name)
	}
	return hosts, nil
}

// defaultHeaders are the headers, besides Authorization, in which the
// APIs of well-known names take their keys: Anthropic's x-api-key (Claude
// Code sends ANTHROPIC_API_KEY there), Google's x-goog-api-key.
var defaultHeaders = map[string][]string{
	"ANTHROPIC_API_KEY": {"x-api-key"},
	"GEMINI_API_KEY":    {"x-goog-api-key"},
}

// Carriers are the headers, besides Authorization and
// Proxy-Authorization, in which the proxy puts s's value: those given to
// `secret set --header`, and a well-known name's own.
func (s Secret) Carriers() []string {
	out := slices.Clone(s.Headers)
	for _, h := range defaultHeaders[s.Name] {
		if !slices.Contains(out, h) {
			out = append(out, h)
		}
	}
	return out
}

var headerRE = regexp.MustCompile("^[a-z0-9!#$%&'*+.^_`|~-]{1,128}$")

// CheckHeader returns header in lower case, or refuses what is not a
// header name, and the headers that carry no credential of their own
// (Authorization always carries it; Host, Cookie and the like would put
// the value where other things go too).
func CheckHeader(header string) (string, error) {
	h := strings.ToLower(strings.TrimSpace(header))
	if !headerRE.MatchString(h) {
		return "", fmt.Errorf("%q is not a header name (hint: a name such as x-api-key)", header)
	}
	switch h {
	case "authorization", "proxy-authorization":
		return "", fmt.Errorf("header %q carries every secret already (hint: leave it out; --header names another header, such as x-api-key)", header)
	case "host", "cookie", "content-type", "content-length", "transfer-encoding", "connection", "user-agent", "referer", "origin":
		return "", fmt.Errorf("header %q is not a credential's own header: a server may send it back (hint: name the header the API reads its key from, such as x-api-key)", header)
	}
	return h, nil
}

// MaxValue bounds a value: credentials are short, and a larger input is
// more likely a file given by mistake.
const MaxValue = 64 << 10

var nameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)

// CheckName refuses a name that is not an environment variable's name:
// the guest sees the secret as that variable.
func CheckName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("secret name %q is not an environment variable name (hint: letters, digits and _, not starting with a digit, e.g. ANTHROPIC_API_KEY)", name)
	}
	return nil
}

var labelRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// CheckHost returns host in its canonical form (lower case, no trailing
// dot), or refuses what is not a DNS name with at least two labels: an
// address, a pattern, a port, a URL.
func CheckHost(host string) (string, error) {
	h := strings.TrimSuffix(strings.ToLower(strings.TrimSpace(host)), ".")
	hint := "(hint: a host name such as api.example.com, without scheme, port, path or wildcard)"
	if _, err := netip.ParseAddr(strings.Trim(h, "[]")); err == nil {
		return "", fmt.Errorf("secret host %q is an address, not a host name: the proxy binds a secret to the name the guest asks for %s", host, hint)
	}
	labels := strings.Split(h, ".")
	if len(h) > 253 || len(labels) < 2 {
		return "", fmt.Errorf("secret host %q is not a DNS name %s", host, hint)
	}
	for _, l := range labels {
		if !labelRE.MatchString(l) {
			return "", fmt.Errorf("secret host %q is not a DNS name %s", host, hint)
		}
	}
	return h, nil
}

// ReadValue reads a value from r (stdin, or what a terminal prompt read):
// one trailing newline (\n or \r\n) is dropped, as a shell's echo or a
// typed line adds it. It refuses an empty value, one over MaxValue, one
// that is not UTF-8 text or holds control characters (other than a tab),
// since an HTTP header could not carry it; the errors never quote the
// input.
func ReadValue(r io.Reader) (Value, error) {
	b, err := io.ReadAll(io.LimitReader(r, MaxValue+3))
	if err != nil {
		return Value{}, fmt.Errorf("reading the secret's value: %w", err)
	}
	b = bytes.TrimSuffix(b, []byte("\n"))
	b = bytes.TrimSuffix(b, []byte("\r"))
	switch {
	case len(b) == 0:
		return Value{}, errors.New("the secret's value is empty (hint: give it on standard input, e.g. `printenv NAME | agent-vm secret set NAME`, or type it at the prompt)")
	case len(b) > MaxValue:
		return Value{}, fmt.Errorf("the secret's value is over %d KiB; credentials are shorter (hint: give the value itself, not a file of them)", MaxValue>>10)
	case !utf8.Valid(b) || bytes.ContainsFunc(b, func(r rune) bool { return r != '\t' && (r < 0x20 || r == 0x7f) }):
		return Value{}, errors.New("the secret's value holds control characters or is not UTF-8 text, which no HTTP header can carry (hint: give the credential alone, on one line)")
	}
	return Value{v: string(b)}, nil
}

// FromEnv is the secret name whose value a run takes from the host's
// environment (an agent's API key), bound to the name's default hosts:
// it is handed to the VM's proxy at the start, never stored.
func FromEnv(name, value string) (Secret, error) {
	if err := CheckName(name); err != nil {
		return Secret{}, err
	}
	hosts := DefaultHosts(name)
	if len(hosts) == 0 {
		return Secret{}, fmt.Errorf("%s has no hosts agent-vm knows to send it to (hint: `agent-vm secret set %s --host HOST`)", name, name)
	}
	v, err := ReadValue(strings.NewReader(value))
	if err != nil {
		return Secret{}, fmt.Errorf("%s in this environment: %w", name, err)
	}
	return Secret{Name: name, Hosts: hosts, Value: v}, nil
}

// Placeholder is a new placeholder for a secret in a VM: PlaceholderPrefix
// and 32 random hex digits, drawn afresh for each VM and secret, so it
// says nothing of the value and is worth nothing outside that VM's proxy.
func Placeholder() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("crypto/rand failed: %v", err)) // the kernel's RNG does not fail on Linux
	}
	return PlaceholderPrefix + hex.EncodeToString(b)
}

// PlaceholderPrefix starts every placeholder, so that the proxy (and a
// reader of a log) can tell one from a real credential.
const PlaceholderPrefix = "agent-vm-placeholder-"

// Store is the secrets in Dir.
type Store struct{ Dir *hostdir.Dir }

func (s *Store) path(name string) string { return filepath.Join(s.Dir.Path, name+".json") }

// Set stores sec, replacing a secret of the same name; hosts are checked
// and put in canonical form, and a secret without hosts gets
// DefaultHosts' or is refused.
func (s *Store) Set(sec Secret) error {
	if err := CheckName(sec.Name); err != nil {
		return err
	}
	if sec.Value.v == "" {
		return errors.New("the secret's value is empty")
	}
	if len(sec.Hosts) == 0 {
		sec.Hosts = DefaultHosts(sec.Name)
	}
	if len(sec.Hosts) == 0 {
		return fmt.Errorf("secret %s is bound to no host (hint: name the hosts it is sent to with --host, e.g. --host api.example.com)", sec.Name)
	}
	var hosts, headers []string
	for _, h := range sec.Hosts {
		c, err := CheckHost(h)
		if err != nil {
			return err
		}
		if !slices.Contains(hosts, c) {
			hosts = append(hosts, c)
		}
	}
	for _, h := range sec.Headers {
		c, err := CheckHeader(h)
		if err != nil {
			return err
		}
		if !slices.Contains(headers, c) {
			headers = append(headers, c)
		}
	}
	if err := s.Dir.Make(); err != nil {
		return err
	}
	return atomicfile.WriteJSON(s.path(sec.Name), file{Name: sec.Name, Hosts: hosts, Headers: headers, VM: sec.VM, Value: sec.Value.v}, 0o600)
}

// ErrNotFound is a name the store has no secret of.
var ErrNotFound = errors.New("no such secret")

// Get reads the secret called name.
func (s *Store) Get(name string) (Secret, error) {
	if err := CheckName(name); err != nil {
		return Secret{}, err
	}
	b, err := os.ReadFile(s.path(name))
	if errors.Is(err, fs.ErrNotExist) {
		return Secret{}, fmt.Errorf("secret %s: %w (hint: `agent-vm secret list` shows the stored ones)", name, ErrNotFound)
	}
	if err != nil {
		return Secret{}, err
	}
	var f file
	if err := json.Unmarshal(b, &f); err != nil || f.Name != name || f.Value == "" {
		// The error does not quote the file: it holds the value.
		return Secret{}, fmt.Errorf("secret file %s is damaged (hint: set the secret again with `agent-vm secret set %s`, or remove it with `agent-vm secret rm %s`)", s.path(name), name, name)
	}
	return Secret{Name: f.Name, Hosts: f.Hosts, Headers: f.Headers, VM: f.VM, Value: Value{v: f.Value}}, nil
}

// List reads every secret, sorted by name. A damaged file is an error
// that names it; the others are still returned.
func (s *Store) List() ([]Secret, error) {
	ents, err := os.ReadDir(s.Dir.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Secret
	var errs []error
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || strings.HasPrefix(e.Name(), ".") || CheckName(name) != nil {
			continue // atomicfile's temporary files, and what is not ours
		}
		sec, err := s.Get(name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, sec)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, errors.Join(errs...)
}

// Remove deletes the secret called name.
func (s *Store) Remove(name string) error {
	if err := CheckName(name); err != nil {
		return err
	}
	err := os.Remove(s.path(name))
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("secret %s: %w (hint: `agent-vm secret list` shows the stored ones)", name, ErrNotFound)
	}
	if err != nil {
		return err
	}
	return atomicfile.SyncDir(s.Dir.Path)
}

// For returns the secrets a VM gets: those for every VM and those for
// the VM whose id is vm.
func For(all []Secret, vm string) []Secret {
	var out []Secret
	for _, s := range all {
		if s.VM == "" || s.VM == vm {
			out = append(out, s)
		}
	}
	return out
}
