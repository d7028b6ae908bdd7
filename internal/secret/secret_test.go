package secret

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/agent-vm/agent-vm/internal/hostdir"
	"github.com/hashicorp/go-hclog"
)

const canary = "sk-ant-canary-3f9d0c2b7e"

func store(t *testing.T) *Store {
	t.Helper()
	top := hostdir.Top(filepath.Join(t.TempDir(), "config", "agent-vm"), 0o700, hostdir.InXDG)
	return &Store{Dir: top.Sub("secrets", 0o700)}
}

func value(t *testing.T, s string) Value {
	t.Helper()
	v, err := ReadValue(strings.NewReader(s))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// Set, Get, List and Remove: a well-known name gets its hosts, hosts are
// put in canonical form once each, the file is 0600 in 0700 directories,
// a second Set replaces the first.
func TestStore(t *testing.T) {
	s := store(t)
	if err := s.Set(Secret{Name: "ANTHROPIC_API_KEY", Value: value(t, canary+"\n")}); err != nil {
		t.Fatal(err)
	}
	if err := s.Set(Secret{Name: "DEPLOY_TOKEN", Hosts: []string{"Deploy.Example.com.", "deploy.example.com", "api.example.com"}, VM: "vm-1", Value: value(t, "first")}); err != nil {
		t.Fatal(err)
	}
	if err := s.Set(Secret{Name: "DEPLOY_TOKEN", Hosts: []string{"deploy.example.com", "api.example.com"}, VM: "vm-1", Value: value(t, "second")}); err != nil {
		t.Fatal(err)
	}
	all, err := s.List()
	if err != nil || len(all) != 2 {
		t.Fatalf("List = %v, %v; want two secrets", all, err)
	}
	a, d := all[0], all[1]
	if a.Name != "ANTHROPIC_API_KEY" || fmt.Sprint(a.Hosts) != "[api.anthropic.com]" || a.VM != "" || a.Value.Reveal() != canary {
		t.Errorf("ANTHROPIC_API_KEY read back as %s %v %q", a.Name, a.Hosts, a.VM)
	}
	if d.Name != "DEPLOY_TOKEN" || fmt.Sprint(d.Hosts) != "[deploy.example.com api.example.com]" || d.VM != "vm-1" || d.Value.Reveal() != "second" {
		t.Errorf("DEPLOY_TOKEN read back as %s %v %q (second value: %v)", d.Name, d.Hosts, d.VM, d.Value.Reveal() == "second")
	}
	for p, want := range map[string]os.FileMode{s.Dir.Path: 0o700, filepath.Dir(s.Dir.Path): 0o700, s.path("DEPLOY_TOKEN"): 0o600} {
		fi, err := os.Stat(p)
		if err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s: %v, %v; want %04o", p, fi.Mode(), err, want)
		}
	}
	if got := For(all, "vm-2"); len(got) != 1 || got[0].Name != "ANTHROPIC_API_KEY" {
		t.Errorf("For another VM: %v; want the secret for every VM only", got)
	}
	if got := For(all, "vm-1"); len(got) != 2 {
		t.Errorf("For vm-1: %v; want both", got)
	}
	if err := s.Remove("DEPLOY_TOKEN"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get("DEPLOY_TOKEN"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get after Remove: %v; want ErrNotFound", err)
	}
	if err := s.Remove("DEPLOY_TOKEN"); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "secret list") {
		t.Errorf("Remove of a missing secret: %v; want ErrNotFound naming secret list", err)
	}
	left, _ := os.ReadDir(s.Dir.Path)
	if len(left) != 1 {
		t.Errorf("the directory holds %d entries, want 1 (no temporary files)", len(left))
	}
}

// Bad input is refused with an error that names it and the fix, and
// leaves the store as it was; no error quotes a value.
func TestStoreRefusesBadInput(t *testing.T) {
	s := store(t)
	if err := s.Set(Secret{Name: "GH_TOKEN", Value: value(t, canary)}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		sec  Secret
		want string
	}{
		{Secret{Name: "1TOKEN", Value: value(t, canary)}, "not an environment variable name"},
		{Secret{Name: "MY-TOKEN", Value: value(t, canary)}, "not an environment variable name"},
		{Secret{Name: "../GH_TOKEN", Value: value(t, canary)}, "not an environment variable name"},
		{Secret{Name: "MY_TOKEN", Value: value(t, canary)}, "bound to no host (hint: name the hosts"},
		{Secret{Name: "MY_TOKEN", Hosts: []string{"10.0.0.1"}, Value: value(t, canary)}, "is an address"},
		{Secret{Name: "MY_TOKEN", Hosts: []string{"[2001:db8::1]"}, Value: value(t, canary)}, "is an address"},
		{Secret{Name: "MY_TOKEN", Hosts: []string{"*.example.com"}, Value: value(t, canary)}, "not a DNS name"},
		{Secret{Name: "MY_TOKEN", Hosts: []string{"https://api.example.com"}, Value: value(t, canary)}, "not a DNS name"},
		{Secret{Name: "MY_TOKEN", Hosts: []string{"api.example.com:443"}, Value: value(t, canary)}, "not a DNS name"},
		{Secret{Name: "MY_TOKEN", Hosts: []string{"localhost"}, Value: value(t, canary)}, "not a DNS name"},
		{Secret{Name: "GH_TOKEN", Hosts: []string{"github.com"}}, "empty"},
	} {
		err := s.Set(c.sec)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Set(%s, %v): %v; want an error saying %q", c.sec.Name, c.sec.Hosts, err, c.want)
		} else if strings.Contains(err.Error(), canary) {
			t.Errorf("an error quotes the value: %v", err)
		}
	}
	all, err := s.List()
	if err != nil || len(all) != 1 || all[0].Value.Reveal() != canary {
		t.Errorf("after the refusals: %v, %v; want GH_TOKEN alone, unchanged", all, err)
	}
}

// ReadValue drops one trailing newline and refuses what no header can
// carry, without quoting it.
func TestReadValue(t *testing.T) {
	for in, want := range map[string]string{"abc\n": "abc", "abc\r\n": "abc", "a b\tc": "a b\tc", "abc\n\n": "abc\n"} {
		v, err := ReadValue(strings.NewReader(in))
		switch {
		case want == "abc\n":
			if err == nil {
				t.Errorf("ReadValue(%q) = %q; want a refusal (a newline inside)", in, v.Reveal())
			}
		case err != nil || v.Reveal() != want:
			t.Errorf("ReadValue(%q) = %q, %v; want %q", in, v.Reveal(), err, want)
		}
	}
	for in, want := range map[string]string{
		"":                                   "empty",
		"\n":                                 "empty",
		canary + "\x1b[31m":                  "control characters",
		canary + "\xff":                      "not UTF-8",
		strings.Repeat("x", MaxValue+1):      "over 64 KiB",
		strings.Repeat("x", MaxValue) + "\n": "",
	} {
		_, err := ReadValue(strings.NewReader(in))
		if want == "" {
			if err != nil {
				t.Errorf("ReadValue of %d bytes: %v; want it read", len(in), err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), canary) {
			t.Errorf("ReadValue(%.20q…): %v; want an error saying %q that quotes nothing", in, err, want)
		}
	}
}

// A Secret printed by mistake, by fmt, JSON or hclog, shows no value.
func TestValueNeverPrints(t *testing.T) {
	sec := Secret{Name: "ANTHROPIC_API_KEY", Hosts: []string{"api.anthropic.com"}, Value: value(t, canary)}
	var out bytes.Buffer
	for _, f := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%d"} {
		fmt.Fprintf(&out, f+"\n", sec)
		fmt.Fprintf(&out, f+"\n", sec.Value)
	}
	b, _ := json.Marshal(sec)
	out.Write(b)
	for _, jsonFormat := range []bool{false, true} {
		hclog.New(&hclog.LoggerOptions{Output: &out, JSONFormat: jsonFormat}).Info("storing", "secret", sec, "value", sec.Value)
	}
	if strings.Contains(out.String(), canary) || strings.Contains(out.String(), fmt.Sprintf("%x", canary)) {
		t.Errorf("the value was printed:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "[redacted]") {
		t.Errorf("no [redacted] in what was printed:\n%s", out.String())
	}
}

// A damaged file is named, with the fix, without quoting its content;
// List still returns the others.
func TestDamagedFile(t *testing.T) {
	s := store(t)
	if err := s.Set(Secret{Name: "OPENAI_API_KEY", Value: value(t, "good")}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.path("GH_TOKEN"), []byte(`{"name":"GH_TOKEN","value":"`+canary), 0o600); err != nil {
		t.Fatal(err)
	}
	all, err := s.List()
	if len(all) != 1 || all[0].Name != "OPENAI_API_KEY" {
		t.Errorf("List kept %v; want OPENAI_API_KEY", all)
	}
	if err == nil || !strings.Contains(err.Error(), "GH_TOKEN.json is damaged") || !strings.Contains(err.Error(), "secret rm GH_TOKEN") || strings.Contains(err.Error(), canary) {
		t.Errorf("List's error: %v; want the damaged file named with the fix, and no value", err)
	}
}

// A secrets directory of this user's that others could read is set to
// 0700 before a secret goes in.
func TestStoreDirectoryModes(t *testing.T) {
	s := store(t)
	if err := os.MkdirAll(s.Dir.Path, 0o755); err != nil {
		t.Fatal(err)
	}
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	if err := s.Set(Secret{Name: "GH_TOKEN", Value: value(t, canary)}); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(s.Dir.Path)
	if fi.Mode().Perm() != 0o700 {
		t.Errorf("a 0755 secrets directory left %04o, want it made 0700", fi.Mode().Perm())
	}
}

// Placeholders: the prefix, 32 hex digits, a new one each time.
func TestPlaceholder(t *testing.T) {
	a, b := Placeholder(), Placeholder()
	if a == b || !strings.HasPrefix(a, PlaceholderPrefix) || len(a) != len(PlaceholderPrefix)+32 {
		t.Errorf("placeholders %q and %q", a, b)
	}
}

// Headers are kept in lower case, once each; Carriers adds a well-known
// name's own; CheckHeader refuses what is not a header name and the
// headers a credential does not own.
func TestHeaders(t *testing.T) {
	s := store(t)
	if err := s.Set(Secret{Name: "ANTHROPIC_API_KEY", Headers: []string{"X-Proxy-Key", "x-proxy-key", "x-api-key"}, Value: value(t, canary)}); err != nil {
		t.Fatal(err)
	}
	a, err := s.Get("ANTHROPIC_API_KEY")
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(a.Headers) != "[x-proxy-key x-api-key]" || fmt.Sprint(a.Carriers()) != "[x-proxy-key x-api-key]" {
		t.Errorf("headers %v, carriers %v; want [x-proxy-key x-api-key] for both", a.Headers, a.Carriers())
	}
	for name, want := range map[string]string{"ANTHROPIC_API_KEY": "[x-api-key]", "GEMINI_API_KEY": "[x-goog-api-key]", "GH_TOKEN": "[]", "MY_TOKEN": "[]"} {
		if got := fmt.Sprint(Secret{Name: name}.Carriers()); got != want {
			t.Errorf("%s's carriers %s, want %s", name, got, want)
		}
	}
	for in, want := range map[string]string{
		"X-Api-Key":     "x-api-key",
		"":              "is not a header name",
		"x api":         "is not a header name",
		"x:y":           "is not a header name",
		"Authorization": "carries every secret already",
		"cookie":        "is not a credential's own header",
		"Host":          "is not a credential's own header",
	} {
		got, err := CheckHeader(in)
		if err != nil {
			got = err.Error()
		}
		if !strings.Contains(got, want) {
			t.Errorf("CheckHeader(%q) = %q, want %q", in, got, want)
		}
	}
	if err := s.Set(Secret{Name: "MY_TOKEN", Hosts: []string{"api.example.com"}, Headers: []string{"Cookie"}, Value: value(t, "v")}); err == nil {
		t.Error("Set stored a secret whose header is Cookie")
	}
}
