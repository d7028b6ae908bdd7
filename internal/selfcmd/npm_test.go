package selfcmd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/cmdline"
)

// __npm-install leaves to npm what it does not unpack itself, with the
// same packages and prefix, and ends with npm's status; npm here is a
// stand-in (labelled: a script at the exec boundary that records its
// arguments and exits with $NPM_EXIT).
func TestNPMInstallLeavesTheRestToNPM(t *testing.T) {
	dir := t.TempDir()
	calls := filepath.Join(dir, "calls")
	npm := "#!/bin/sh\n# FAKE npm for TestNPMInstallLeavesTheRestToNPM\necho \"$@\" >>" + calls + "\nexit ${NPM_EXIT:-0}\n"
	if err := os.WriteFile(filepath.Join(dir, "npm"), []byte(npm), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+":/usr/bin:/bin")
	t.Setenv("HOME", dir)
	t.Setenv("npm_config_globalconfig", filepath.Join(dir, "none"))

	// A range is npm's to resolve.
	r := run(t, nil, nil, "__npm-install", "--prefix", filepath.Join(dir, "p"), "--", "tool@^1.0.0", "other@1.0.0")
	b, _ := os.ReadFile(calls)
	if r.code != 0 || string(b) != "install --global --prefix "+dir+"/p --no-fund --no-audit --no-update-notifier -- tool@^1.0.0 other@1.0.0\n" ||
		!strings.Contains(r.stderr, "npm must install them") || !strings.Contains(r.stderr, "tool@^1.0.0") {
		t.Errorf("a range: exit %d, npm ran %q\nstderr: %s", r.code, b, r.stderr)
	}
	// A configuration it does not read (credentials), no prefix named
	// (npm's own): npm, and npm's failure is the command's.
	os.Remove(calls)
	os.WriteFile(filepath.Join(dir, ".npmrc"), []byte("//registry.npmjs.org/:_authToken=x\n"), 0o600)
	t.Setenv("NPM_EXIT", "7")
	for _, c := range []struct {
		args []string
		npm  string
	}{
		{[]string{"--prefix", "/opt/x"}, "install --global --prefix /opt/x --no-fund --no-audit --no-update-notifier -- tool@1.0.0\n"},
		{nil, "install --global --no-fund --no-audit --no-update-notifier -- tool@1.0.0\n"},
	} {
		os.Remove(calls)
		r = run(t, nil, nil, append(append([]string{"__npm-install"}, c.args...), "--", "tool@1.0.0")...)
		b, _ = os.ReadFile(calls)
		if r.code != 7 || string(b) != c.npm || !strings.Contains(r.stderr, "configuration sets //registry.npmjs.org/:_authToken") {
			t.Errorf("credentials in .npmrc, %q: exit %d, npm ran %q\nstderr: %s", c.args, r.code, b, r.stderr)
		}
	}
	// No packages: a usage error, and npm is not run.
	os.Remove(calls)
	r = run(t, nil, nil, "__npm-install")
	if _, err := os.Stat(calls); r.code != cmdline.ExitUsage || err == nil || !strings.Contains(r.stderr, "NAME@VERSION") {
		t.Errorf("no packages: exit %d (npm ran: %v)\nstderr: %s", r.code, err == nil, r.stderr)
	}
}
