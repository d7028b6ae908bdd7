package cloudinit

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/secret"
)

// TestSecretEnvScript runs guest/secret-env on a copy of an
// /etc/environment: the placeholders of this start replace an earlier
// start's, and no other line changes.
func TestSecretEnvScript(t *testing.T) {
	script := guestScripts(t)["secret-env"]
	const envLine = "env=/etc/environment\n"
	if !strings.Contains(script, envLine) {
		t.Fatalf("guest/secret-env does not set %q", envLine)
	}
	if !strings.Contains(script, "="+secret.PlaceholderPrefix+"'") {
		t.Fatalf("guest/secret-env does not recognise placeholders by %q", secret.PlaceholderPrefix)
	}
	dir := t.TempDir()
	env := filepath.Join(dir, "environment")
	script = strings.Replace(script, envLine, "env="+env+"\n", 1)
	old := "PATH=/usr/bin:/bin\nhttp_proxy=http://10.0.2.100:3128\nGH_TOKEN=" + secret.PlaceholderPrefix + "0123\nNOTE=keep agent-vm-placeholder- in the middle\n"
	if err := os.WriteFile(env, []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) {
		t.Helper()
		res, err := execx.OS{}.Run(context.Background(), execx.Cmd{Path: "sh", Args: append([]string{"-c", script, "agent-vm-secret-env"}, args...)})
		if err != nil {
			t.Fatalf("secret-env: %v\n%s", err, res.Stderr)
		}
	}
	run("ANTHROPIC_API_KEY="+secret.PlaceholderPrefix+"abcd", "OPENAI_API_KEY="+secret.PlaceholderPrefix+"ef01")
	got, _ := os.ReadFile(env)
	want := "PATH=/usr/bin:/bin\nhttp_proxy=http://10.0.2.100:3128\nNOTE=keep agent-vm-placeholder- in the middle\n" +
		"ANTHROPIC_API_KEY=" + secret.PlaceholderPrefix + "abcd\nOPENAI_API_KEY=" + secret.PlaceholderPrefix + "ef01\n"
	if string(got) != want {
		t.Errorf("after the first start:\n%s\nwant:\n%s", got, want)
	}
	run() // a start with no secrets left
	got, _ = os.ReadFile(env)
	if want := "PATH=/usr/bin:/bin\nhttp_proxy=http://10.0.2.100:3128\nNOTE=keep agent-vm-placeholder- in the middle\n"; string(got) != want {
		t.Errorf("after a start without secrets:\n%s\nwant:\n%s", got, want)
	}
	if fi, err := os.Stat(env); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("the file's mode: %v %v, want 0644", fi.Mode(), err)
	}
}

func TestSetup(t *testing.T) {
	if s, err := Setup(nil, nil); s != "" || err != nil {
		t.Errorf("Setup with nothing to do = %q, %v; want no script", s, err)
	}
	s, err := Setup([]string{"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----"}, map[string]string{"B": "pb", "A": "pa"})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if lines[0] != "set -eu" || !strings.Contains(s, "agent-vm-ca-certs") || !strings.HasSuffix(s, " agent-vm-secret-env A=pa B=pb\n") {
		t.Errorf("Setup's script, names sorted after the CA step:\n%s", s)
	}
}
