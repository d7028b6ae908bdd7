package egress

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/credswap"
	"github.com/agent-vm/agent-vm/internal/testutil"
)

// TestReadBundle: a bundle agent-vm wrote makes an Interceptor bound to its
// secrets' hosts; a damaged one is refused without quoting what it held.
func TestReadBundle(t *testing.T) {
	cert, key, err := NewCA("feat-x")
	if err != nil {
		t.Fatal(err)
	}
	const value = "canary-value-2718"
	ph := "agent-vm-placeholder-0123456789abcdef0123456789abcdef"
	good := Bundle{CACert: string(cert), CAKey: string(key), Branch: "feat/x", Repo: "/o/r",
		Secrets: []credswap.Secret{{Name: "GH_TOKEN", Placeholder: ph, Value: value, Hosts: []string{"github.com"}}}}
	raw, _ := json.Marshal(good)
	ic, err := ReadBundle(strings.NewReader(string(raw)), "")
	if err != nil {
		t.Fatal(err)
	}
	if !ic.Bound("github.com") || ic.Bound("example.org") || ic.PushBranch != "feat/x" || ic.PushRepo != "/o/r" || ic.RootCAs != nil {
		t.Errorf("interceptor: bound github.com %v, example.org %v, push %q %q", ic.Bound("github.com"), ic.Bound("example.org"), ic.PushBranch, ic.PushRepo)
	}

	// A test's root CA is trusted as well as the host's.
	caPEM, _, _ := testutil.SelfSigned(t, "test-root", true)
	rootFile := filepath.Join(t.TempDir(), "root.pem")
	if err := os.WriteFile(rootFile, []byte(caPEM), 0o600); err != nil {
		t.Fatal(err)
	}
	if ic, err := ReadBundle(strings.NewReader(string(raw)), rootFile); err != nil || ic.RootCAs == nil {
		t.Errorf("with a test root CA: %v", err)
	}

	other, _, _ := NewCA("other")
	mismatched := good
	mismatched.CACert = string(other)
	short := good
	short.Secrets = []credswap.Secret{{Name: "GH_TOKEN", Placeholder: "x", Value: value, Hosts: []string{"github.com"}}}
	for name, c := range map[string]struct {
		in, rootCA, want string
	}{
		"not JSON":          {`{"secrets": [{"Value": "` + value + `"`, "", "not a bundle agent-vm wrote"},
		"CA key mismatched": {mustJSON(t, mismatched), "", "the key does not match"},
		"short placeholder": {mustJSON(t, short), "", "placeholder is shorter"},
		"no root CA file":   {string(raw), filepath.Join(t.TempDir(), "none.pem"), TestRootCAEnv},
		"too long":          {strings.Repeat(" ", maxBundle+1), "", "over 8 MiB"},
	} {
		_, err := ReadBundle(strings.NewReader(c.in), c.rootCA)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", name, err, c.want)
		} else if strings.Contains(err.Error(), value) {
			t.Errorf("%s: the error quotes the value: %v", name, err)
		}
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
