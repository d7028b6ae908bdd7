package selfcmd

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/cmdline"
	"github.com/agent-vm/agent-vm/internal/egress"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// Started by a root agent-vm for a VM whose QEMU runs as the workspace's
// owner, the proxy drops to that owner before it serves, and still reads
// its policy and writes its log in the network directory, which the owner
// could not reach by path (a 0700 directory of root's above it). It exits
// once its QEMU is gone.
func TestNetProxyDropsToTheOwner(t *testing.T) {
	tu.Need(t, os.Geteuid() == 0, "dropping privileges needs root")
	top := t.TempDir() // root's, 0700: the owner cannot walk through it
	dir := filepath.Join(top, "net")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if err := egress.WritePolicy(dir, egress.Policy{Branch: "x", Mode: egress.ModeAllow}); err != nil {
		t.Fatal(err)
	}
	qemu := exec.Command("sleep", "60") // stands for the VM's QEMU
	if err := qemu.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { qemu.Process.Kill(); qemu.Wait() }()
	pidFile := filepath.Join(top, "qemu.pid")
	os.WriteFile(pidFile, []byte(strconv.Itoa(qemu.Process.Pid)+"\n"), 0o600)
	sock, exposed := filepath.Join(top, "egress.sock"), filepath.Join(top, "exposed.sock")
	var out bytes.Buffer
	proxy := exec.Command(tu.AgentVMBinary(t), "__net-proxy", "--dir", dir, "--proxy-socket", sock, "--exposed-socket", exposed,
		"--qemu-pidfile", pidFile, "--run-as", "65534:65534")
	proxy.Stdout, proxy.Stderr = &out, &out
	if err := proxy.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- proxy.Wait() }()
	defer proxy.Process.Kill()

	// A denied request through the socket (root may connect to it).
	var resp strings.Builder
	req := strings.NewReader("GET http://denied.test/ HTTP/1.1\r\nHost: denied.test\r\nConnection: close\r\n\r\n")
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	var err error
	if perr := tu.Poll(wctx, "the proxy to serve", func() bool {
		resp.Reset()
		err = egress.Relay(context.Background(), sock, 0, req, &resp)
		return err == nil
	}); perr != nil {
		t.Fatalf("%v: %v\n%s", perr, err, out.String())
	}
	if !strings.Contains(resp.String(), "rule: not on the allow-list") {
		t.Errorf("the proxy's answer: %q", resp.String())
	}
	status, _ := os.ReadFile("/proc/" + strconv.Itoa(proxy.Process.Pid) + "/status")
	if !strings.Contains(string(status), "\nUid:\t65534\t65534\t65534\t65534\n") || !strings.Contains(string(status), "\nGid:\t65534\t65534\t65534\t65534\n") ||
		!regexp.MustCompile(`\nGroups:\s*\n`).Match(status) {
		t.Errorf("the proxy is not the owner, without groups:\n%s", status)
	}
	logFile := filepath.Join(dir, egress.LogFile)
	es, err := egress.ReadLog(logFile)
	fi, _ := os.Stat(logFile)
	if err != nil || len(es) != 1 || es[0].Host != "denied.test" || fi == nil || fi.Sys().(*syscall.Stat_t).Uid != 65534 {
		t.Errorf("the log: %+v %v %v", es, err, fi)
	}
	// Its QEMU gone, the proxy ends.
	qemu.Process.Kill()
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the proxy outlived its QEMU")
	}
	// A root UID or a malformed one is refused.
	for _, bad := range []string{"0:0", "nobody", "-1:5"} {
		r := run(t, nil, nil, "__net-proxy", "--dir", dir, "--proxy-socket", sock, "--exposed-socket", exposed, "--run-as", bad)
		if r.code != 1 || !strings.Contains(r.stderr, "is not UID:GID") {
			t.Errorf("--run-as %q: exit %d %s", bad, r.code, r.stderr)
		}
	}
}

// net-proxy's TCP front flags, refused as usage errors (exit 2) naming the
// flag before anything listens: --front-exposed (or its old name,
// --front-exposed) or --front-ports without
// --front, --front that is not an address, --front without a ports file,
// and neither sockets nor a front.
func TestNetProxyFrontRefusals(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--front-exposed", "8080"}, "--front-exposed and --front-ports need --front"},
		{[]string{"--front-exposed", "8080"}, "--front-exposed and --front-ports need --front"},
		{[]string{"--front-ports", filepath.Join(dir, "p.json")}, "--front-exposed and --front-ports need --front"},
		{[]string{"--front", "bridge", "--front-ports", filepath.Join(dir, "p.json")}, `--front "bridge" is not an IP address`},
		{[]string{"--front", "127.0.0.1"}, "--front needs --front-ports"},
		{nil, "net-proxy needs --proxy-socket"},
	} {
		r := run(t, nil, nil, append([]string{"net-proxy", "--dir", dir}, tc.args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("net-proxy %q: exit %d\n%s\nwant %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("the refusals left %v", ents)
	}
}

// The shipped build (no agentvm_testhooks tag, as `go test` builds this
// package) has no proxy test hooks: net-proxy ignores their variables,
// saying so. (cli's test of the version line holds the other half.)
func TestShippedProxyHasNoTestHooks(t *testing.T) {
	if egress.TestHooks {
		// Skip, not SkipOrFail: nothing is missing here; the build this
		// test is about is the other one.
		t.Skip("built with -tags agentvm_testhooks: this test is about the build without")
	}
	dir := t.TempDir()
	r := run(t, nil, map[string]string{egress.TestHostsEnv: "github.com=198.18.0.9", egress.TestRootCAEnv: "/tmp/ca.pem"},
		"__net-proxy", "--dir", dir, "--proxy-socket", filepath.Join(dir, "p.sock"), "--exposed-socket", filepath.Join(dir, "d.sock"), "--run-as", "0:0")
	for _, v := range []string{egress.TestHostsEnv, egress.TestRootCAEnv} {
		if !strings.Contains(r.stderr, "ignored: this agent-vm is built without the proxy's test hooks") || !strings.Contains(r.stderr, v) {
			t.Errorf("net-proxy with %s set: stderr %q; want it named as ignored", v, r.stderr)
		}
	}
}

// net-relay without its SOCKET is a usage error, exit 2; a proxy that is
// not there exits 1. The relay prints nothing, ever: its stderr is the
// guest's connection.
func TestNetRelayPrintsNothing(t *testing.T) {
	for _, c := range []struct {
		args []string
		code int
	}{
		{[]string{"net-relay"}, cmdline.ExitUsage},
		{[]string{"__net-relay", "a", "b", "c"}, cmdline.ExitUsage},
		{[]string{"__net-relay", "a", "http"}, cmdline.ExitUsage},
		{[]string{"__net-relay", filepath.Join(t.TempDir(), "no.sock")}, cmdline.ExitError},
	} {
		if r := run(t, nil, nil, c.args...); r.code != c.code || r.stdout+r.stderr != "" {
			t.Errorf("%q: exit %d, printed %q %q; want exit %d and nothing", c.args, r.code, r.stdout, r.stderr, c.code)
		}
	}
}
