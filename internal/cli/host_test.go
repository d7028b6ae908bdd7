package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/agent-vm/agent-vm/internal/sshx/sshdtest"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
	"github.com/agent-vm/agent-vm/internal/testutil/libvirtd"
)

// host add, list (table and JSON) and rm through the command line, with a
// configuration directory of the test's own; a damaged host file is named
// by list and removed by rm.
func TestHostAddListRm(t *testing.T) {
	st, cfg := t.TempDir(), t.TempDir()
	env := map[string]string{"XDG_CONFIG_HOME": cfg}
	run := func(args ...string) result {
		t.Helper()
		r := agentVMEnv(t, "", st, env, args...)
		if r.code != 0 {
			t.Fatalf("agent-vm %s: exit %d\n%s%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
		}
		return r
	}
	if r := run("host", "list"); !strings.Contains(r.stdout, "no hosts (hint: `agent-vm host add NAME URI`") {
		t.Errorf("empty list:\n%s", r.stdout)
	}
	if r := run("host", "list", "--json"); strings.TrimSpace(r.stdout) != "[]" {
		t.Errorf("empty list --json: %q", r.stdout)
	}
	if r := run("host", "add", "big", "qemu+ssh://ann@big.example.com:2222/system?keyfile=/k/id"); !strings.Contains(r.stdout, "added host big") || !strings.Contains(r.stdout, "`agent-vm host link big` sets up") || !strings.Contains(r.stdout, "agent-vm host doctor big") {
		t.Errorf("add:\n%s", r.stdout)
	}
	if r := run("host", "add", "here", "qemu:///system"); strings.Contains(r.stdout, "host link") {
		t.Errorf("add of this machine's libvirtd hints at a link:\n%s", r.stdout)
	}
	r := run("host", "list")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "NAME") || !strings.Contains(lines[0], "URI") || !strings.Contains(lines[0], "ADDED") ||
		!strings.Contains(lines[1], "big") || !strings.Contains(lines[1], "qemu+ssh://ann@big.example.com:2222/system?keyfile=/k/id") || !strings.Contains(lines[2], "here") {
		t.Errorf("list:\n%s", r.stdout)
	}
	var list []struct{ Name, URI, Added string }
	if err := json.Unmarshal([]byte(run("host", "ls", "--json").stdout), &list); err != nil || len(list) != 2 || list[0].Name != "big" || list[1].URI != "qemu:///system" || list[0].Added == "" {
		t.Errorf("list --json: %+v, %v", list, err)
	}
	dir := filepath.Join(cfg, "agent-vm", "hosts")
	if fi, err := os.Stat(filepath.Join(dir, "big.json")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("big.json: %v, %v", fi, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "here.json"), []byte("{ not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := agentVMEnv(t, "", st, env, "host", "list"); r.code != 1 || !strings.Contains(r.stdout, "big") || !strings.Contains(r.stderr, filepath.Join(dir, "here.json")) {
		t.Errorf("list with a damaged file: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := run("host", "rm", "here"); !strings.Contains(r.stdout, "removed host here") {
		t.Errorf("rm:\n%s", r.stdout)
	}
	run("host", "rm", "big")
	if r := run("host", "list"); !strings.Contains(r.stdout, "no hosts") {
		t.Errorf("list after rm:\n%s", r.stdout)
	}
}

// host doctor of a qemu+ssh host nobody answers for (nothing listens on
// port 1 here): real virsh and ssh fail at once, one line (and the link's,
// not set up, saying how), exit 1, and the error names the host and how to
// log in without a prompt. JSON says the same on stdout.
func TestHostDoctorUnreachable(t *testing.T) {
	tu.Program(t, "virsh")
	tu.Program(t, "ssh")
	st := t.TempDir()
	env := map[string]string{"XDG_CONFIG_HOME": t.TempDir()}
	const uri = "qemu+ssh://nobody@127.0.0.1:1/system"
	if r := agentVMEnv(t, "", st, env, "host", "add", "gone", uri); r.code != 0 {
		t.Fatalf("host add: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r := agentVMEnv(t, "", st, env, "host", "doctor", "gone")
	if r.code != 1 || !strings.Contains(r.stdout, "--  libvirt") || strings.Count(r.stdout, "\n") > 5 || !strings.Contains(r.stdout, "agent-vm host link gone") ||
		!strings.Contains(r.stderr, "host gone ("+uri+"): libvirt is not reachable (hint: `ssh -p 1 nobody@127.0.0.1 true` must log in without a prompt") {
		t.Errorf("host doctor gone: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = agentVMEnv(t, "", st, env, "host", "doctor", "gone", "--json")
	var rep struct {
		Host      string
		OK        bool
		Reachable bool
		Checks    []struct{ Name, Detail string }
	}
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil || r.code != 1 || rep.Host != "gone" || rep.OK || rep.Reachable || len(rep.Checks) != 2 {
		t.Errorf("host doctor gone --json: exit %d, %+v, %v\n%s%s", r.code, rep, err, r.stdout, r.stderr)
	}
}

// host link through the command line against this machine's sshd
// stand-in (root): its refusals (no such host, this machine's libvirtd,
// no terminal and no --host-key, a fingerprint that is not the host's),
// each exit 1 with nothing pinned; then the pin, the key to install, and
// host doctor's line for the link before and after it is installed.
func TestHostLink(t *testing.T) {
	srv := sshdtest.New(t)
	libvirtd.ForTest(t)
	srv.Start()
	st, cfg := t.TempDir(), t.TempDir()
	env := map[string]string{"XDG_CONFIG_HOME": cfg}
	run := func(args ...string) result { t.Helper(); return agentVMEnv(t, "", st, env, args...) }
	fp := ssh.FingerprintSHA256(srv.HostKey.Public)
	if r := run("host", "add", "big", fmt.Sprintf("qemu+ssh://%s@127.0.0.1:%d/system", srv.User, srv.Port)); r.code != 0 {
		t.Fatalf("host add: %d %s", r.code, r.stderr)
	}
	run("host", "add", "here", "qemu:///system")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"host", "link", "nope"}, "host nope: no such host; the hosts are big, here"},
		{[]string{"host", "link", "here"}, "no SSH link to set up"},
		{[]string{"host", "link", "big"}, "presents host key " + fp + ": host key not confirmed (hint: check it on the host"},
		{[]string{"host", "link", "big", "--host-key", "SHA256:AAAA"}, "not the SHA256:AAAA you gave: nothing pinned"},
		{[]string{"host", "link"}, "host link takes one NAME"},
	} {
		r := run(tc.args...)
		if r.code == 0 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%q: exit %d\n%s%s\nwant %q", tc.args, r.code, r.stdout, r.stderr, tc.want)
		}
	}
	dir := filepath.Join(cfg, "agent-vm", "hosts")
	if ms, _ := filepath.Glob(filepath.Join(dir, "big.*")); len(ms) != 1 {
		t.Fatalf("the refusals left %q", ms)
	}
	r := run("host", "link", "big", "--host-key", fp)
	if r.code != 0 || !strings.Contains(r.stdout, "pinned host big's key "+fp) || !strings.Contains(r.stdout, "(made now)") ||
		!strings.Contains(r.stdout, "~"+srv.User+"/.ssh/authorized_keys") {
		t.Fatalf("host link big: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	pub, err := os.ReadFile(filepath.Join(dir, "big.key.pub"))
	if err != nil || !strings.Contains(r.stdout, strings.TrimSpace(string(pub))) {
		t.Errorf("the printed key is not big.key.pub (%v)", err)
	}
	linkLine := func() string {
		out := run("host", "doctor", "big").stdout
		i := strings.Index(out, "agent-vm's link")
		if i < 0 {
			t.Fatalf("no link line:\n%s", out)
		}
		return out[i-4:]
	}
	if l := linkLine(); !strings.HasPrefix(l, "--  ") || !strings.Contains(l, "does not accept agent-vm's key") {
		t.Errorf("the link's line before the key is installed:\n%s", l)
	}
	srv.Authorize(pub)
	if l := linkLine(); !strings.HasPrefix(l, "ok  ") || !strings.Contains(l, fp) || !strings.Contains(l, "over it") {
		t.Errorf("the link's line once the key is installed:\n%s", l)
	}
	if r := run("host", "link", "big", "--host-key", fp, "--json"); r.code != 0 || !strings.Contains(r.stdout, `"new_key": false`) {
		t.Errorf("a second link: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}
