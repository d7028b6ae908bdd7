package egress

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

func TestDecide(t *testing.T) {
	p := Policy{Mode: ModeAllow, Allow: []string{"api.anthropic.com", "*.example.com", "203.0.113.7", "2001:db8::1"},
		Deny: []string{"bad.example.com"}}
	for _, tc := range []struct {
		mode, host string
		allowed    bool
		rule       string
	}{
		{ModeAllow, "api.anthropic.com", true, "allow api.anthropic.com"},
		{ModeAllow, "API.Anthropic.com.", true, "allow api.anthropic.com"},
		{ModeAllow, "x.api.anthropic.com", false, "not on the allow-list"},
		{ModeAllow, "a.b.example.com", true, "allow *.example.com"},
		{ModeAllow, "example.com", false, "not on the allow-list"},
		{ModeAllow, "notexample.com", false, "not on the allow-list"},
		{ModeAllow, "bad.example.com", false, "deny bad.example.com"},
		{ModeAllow, "203.0.113.7", true, "allow 203.0.113.7"},
		{ModeAllow, "[2001:db8::1]", true, "allow 2001:db8::1"},
		{ModeAllow, "203.0.113.8", false, "IP address not on the allow-list"},
		{ModeAllow, "127.0.0.1", false, "IP address not on the allow-list"},
		{ModeOpen, "anything.org", true, "mode open"},
		{ModeOpen, "bad.example.com", false, "deny bad.example.com"},
		{ModeOffline, "api.anthropic.com", false, "mode offline"},
	} {
		p.Mode = tc.mode
		d := p.Decide(tc.host)
		if d.Allowed != tc.allowed || d.Rule != tc.rule {
			t.Errorf("%s: Decide(%q) = %v %q, want %v %q", tc.mode, tc.host, d.Allowed, d.Rule, tc.allowed, tc.rule)
		}
	}
}

func TestCheckPattern(t *testing.T) {
	for in, want := range map[string]string{"Example.COM": "example.com", "*.example.com": "*.example.com",
		"10.0.0.1": "10.0.0.1", "[::1]": "::1", "a_b.example.org.": "a_b.example.org"} {
		if got, err := CheckPattern(in); err != nil || got != want {
			t.Errorf("CheckPattern(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "*", "*.", "a.*.com", "-a.com", "a..com", "http://a.com", "a.com:443", "a b"} {
		if got, err := CheckPattern(in); err == nil {
			t.Errorf("CheckPattern(%q) = %q, want an error", in, got)
		}
	}
}

// As root, the policy file of a directory another user owns is that
// user's: the proxy, dropped to that user, reads it.
func TestPolicyFileBelongsToTheDirectorysOwner(t *testing.T) {
	tu.Need(t, os.Geteuid() == 0, "chown needs root")
	dir := t.TempDir()
	if err := os.Chown(dir, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ { // made, then replaced
		if err := WritePolicy(dir, Policy{Mode: ModeOffline}); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(filepath.Join(dir, PolicyFile))
		if st := fi.Sys().(*syscall.Stat_t); err != nil || st.Uid != 65534 || st.Gid != 65534 || fi.Mode().Perm() != 0o600 {
			t.Fatalf("policy file %d:%d %v %v; want 65534:65534 0600", st.Uid, st.Gid, fi.Mode(), err)
		}
	}
}

func TestPolicyFile(t *testing.T) {
	dir := t.TempDir()
	want := Policy{Branch: "feat", Mode: ModeAllow, Allow: []string{"a.com"}, Exposed: []int{4599}}
	if err := WritePolicy(dir, want); err != nil {
		t.Fatal(err)
	}
	got, err := ReadPolicy(dir)
	if err != nil || got.Branch != "feat" || got.Mode != ModeAllow || len(got.Allow) != 1 || !got.Exposes(4599) || got.Exposes(80) {
		t.Fatalf("ReadPolicy = %+v, %v; want %+v", got, err, want)
	}
	if fi, err := os.Stat(filepath.Join(dir, PolicyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("policy file: %v %v; want 0600", fi, err)
	}
	if err := CheckMode("closed"); err == nil {
		t.Error("CheckMode(closed) accepted an unknown mode")
	}
}
