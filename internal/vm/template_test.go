package vm_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/hostdir"
	"github.com/agent-vm/agent-vm/internal/image"
	"github.com/agent-vm/agent-vm/internal/qemu"
	"github.com/agent-vm/agent-vm/internal/sshx"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/template"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
	"github.com/agent-vm/agent-vm/internal/vm"
)

// TestTemplate builds a template from a real boot, starts two new VMs
// from it and checks that they are two machines: their own host keys,
// client keys (the template's refused), machine-ids, hostnames, RNG output
// and workspaces. A template whose recorded QEMU version is not this
// host's is refused, and the VM boots cold instead.
//
// Their kernel boot ids differ too, from each other's and from the
// template's (which the guest cannot change: the driver writes each
// clone's into its memory before it runs; internal/template/bootid.go).
//
// A third VM starts from it for secretsStayOnTheHost. Then, on the first
// clone (booted cold by then), checkpointsAsTheAgentWorks,
// forkStartsAsItself and suspendPausesABusyVM.
func TestTemplate(t *testing.T) {
	m := newManager(t)
	var logs tu.SyncBuffer
	m.Log = hclog.New(&hclog.LoggerOptions{Level: hclog.Debug, Output: io.MultiWriter(testWriter{t}, &logs)})
	m.TemplateDir = hostdir.Top(t.TempDir(), 0o700, hostdir.InXDG)
	m.Drivers["qemu"].(*qemu.Driver).Launcher.Log = m.Log // its restore timings
	ctx := context.Background()

	a := create(t, m, "tmpl-a")
	build, err := templates(m).Build(ctx, "tmpl-a", "none", template.Boot{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("template built in %s (%s), load %s", build.Took, build.Dir, loadavg())
	t.Cleanup(func() { _ = templates(m).Remove(context.Background(), "all") })
	if fi, err := os.Stat(filepath.Join(build.Dir, "disk.qcow2")); err != nil || fi.Mode().Perm() != 0o400 {
		t.Errorf("the template's disk: %v %v, want it read-only (0400)", err, fi)
	}

	type guestFacts struct{ hostKey, machineID, bootID, random, hostname, instanceID string }
	facts := map[string]guestFacts{}
	for _, b := range []string{"tmpl-a", "tmpl-b"} {
		e, taken := a, 0
		if b != "tmpl-a" {
			e = create(t, m, b)
			// Another program took the SSH port agent-vm picked for it
			// while it was stopped (another user's VM): the start moves it.
			taken = e.Record.Ports.SSH
			ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(taken)))
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
		}
		began := time.Now()
		res := start(t, m, b)
		if !res.FromTemplate {
			t.Fatalf("%s did not start from the template", b)
		}
		if taken != 0 {
			if res.Info.Ports.SSH == taken {
				t.Errorf("%s started on SSH port %d, which another program holds", b, taken)
			}
			if e, err = m.Find(ctx, b); err != nil || e.Record.Ports.SSH != res.Info.Ports.SSH {
				t.Fatalf("%s's record after the start: %v, SSH port %d; want %d", b, err, e.Record.Ports.SSH, res.Info.Ports.SSH)
			}
		}
		t.Logf("%s from the template: SSH after %s, agent-mcp after %s, load %s", b, res.SSHReady, res.HealthReady, loadavg())
		sh := guestSh(t, m, b)
		f := guestFacts{
			random:     sh("head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'"),
			hostKey:    sh("cut -d' ' -f2 /etc/ssh/ssh_host_ed25519_key.pub"),
			machineID:  sh("cat /etc/machine-id"),
			bootID:     sh("cat /proc/sys/kernel/random/boot_id"),
			hostname:   sh("hostname"),
			instanceID: sh("cat /var/lib/cloud/data/instance-id"),
		}
		facts[b] = f
		// The SSH connections the template had when it was saved are
		// ended: each of sshd's connections now (its listener's children)
		// was made by this start or after (their ages, from the guest's
		// uptime, which a restore carries on from the template's).
		ages := sh("sudo -n ps -o etimes= --ppid \"$(cat /run/sshd.pid)\"")
		for _, a := range strings.Fields(ages) {
			if n, err := strconv.Atoi(a); err != nil || float64(n) > time.Since(began).Seconds()+2 {
				t.Errorf("%s: sshd has a connection %s s old, older than this start (%s): the template's (ages %q)", b, a, time.Since(began).Round(time.Second), ages)
			}
		}
		t.Logf("%s: vmgenid in the guest: %q", b, sh("ls /sys/bus/acpi/drivers/vmgenid 2>/dev/null | head -3; dmesg 2>/dev/null | grep -i -m2 'vmgenid\\|crng' || true"))
		pub, _ := os.ReadFile(e.Layout.HostPubKey())
		if want := strings.Fields(string(pub))[1]; f.hostKey != want {
			t.Errorf("%s: the guest's host key is %s, want the VM's own %s", b, f.hostKey, want)
		}
		if f.hostname != e.Slug {
			t.Errorf("%s: hostname %q, want %q", b, f.hostname, e.Slug)
		}
		if want := e.Record.ID + "-0"; f.instanceID != want {
			t.Errorf("%s: cloud-init's instance-id %q, want the VM's %q (else its next cold boot provisions it again)", b, f.instanceID, want)
		}
		// The template's client key no longer logs in.
		tl := state.Layout{Dir: build.Dir}
		target := sshx.Target{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(e.Record.Ports.SSH)), User: e.Record.Guest.User,
			KeyFile: tl.ClientKey(), KnownHosts: e.Layout.KnownHosts()}
		if c, err := sshx.Dial(ctx, target, 20*time.Second); err == nil {
			c.Close()
			t.Errorf("%s: the template's client key still logs in", b)
		} else if !strings.Contains(err.Error(), "unable to authenticate") {
			t.Errorf("%s: the template's key: got %v, want an authentication failure", b, err)
		}
		// Its own workspace, both ways.
		if err := os.WriteFile(filepath.Join(e.Layout.Workspace(), "from-host"), []byte(b+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := sh("cat /workspace/from-host"); got != b {
			t.Errorf("%s: /workspace/from-host reads %q", b, got)
		}
		if got := sh("systemctl is-active agent-mcp"); got != "active" {
			t.Errorf("%s: agent-mcp is %s", b, got)
		}
		// Its first run ran, with nothing to provision (in the readying
		// session: nothing installs, no provision.sh), on this boot.
		if got, boot := sh("head -n 1 "+guest.ProvisionStatus), sh("grep ^boot= "+guest.ProvisionStatus); got != "status=skipped" || boot != "boot="+sh("cat /proc/sys/kernel/random/boot_id") {
			t.Errorf("%s: the provisioning's status %q, %q; want skipped on this boot", b, got, boot)
		}
		// agent-mcp has this VM's token (from its QEMU's fw_cfg), not the
		// template's.
		token, _ := os.ReadFile(e.Layout.MCPToken())
		if got := sh("sudo -n cat /run/agent-vm/mcp-token"); got != strings.TrimSpace(string(token)) {
			t.Errorf("%s: the guest's MCP token is not the VM's", b)
		}
	}
	fa, fb := facts["tmpl-a"], facts["tmpl-b"]
	for what, pair := range map[string][2]string{"host key": {fa.hostKey, fb.hostKey}, "machine-id": {fa.machineID, fb.machineID},
		"RNG output": {fa.random, fb.random}, "hostname": {fa.hostname, fb.hostname}} {
		if pair[0] == pair[1] || pair[0] == "" {
			t.Errorf("the two VMs from one template have the same %s %q", what, pair[0])
		}
	}
	var tmpl struct {
		BootID struct {
			ID string `json:"id"`
		} `json:"boot_id"`
	}
	if b, err := os.ReadFile(filepath.Join(build.Dir, "template.json")); err != nil || json.Unmarshal(b, &tmpl) != nil || tmpl.BootID.ID == "" {
		t.Errorf("template.json does not say the template's boot id: %v", err)
	}
	t.Logf("boot ids: template %s, clones %s and %s", tmpl.BootID.ID, fa.bootID, fb.bootID)
	if fa.bootID == fb.bootID || fa.bootID == tmpl.BootID.ID || fb.bootID == tmpl.BootID.ID || len(fa.bootID) != 36 || len(fb.bootID) != 36 {
		t.Errorf("the clones' kernel boot ids are %q and %q, the template's %q: want three different ids", fa.bootID, fb.bootID, tmpl.BootID.ID)
	}

	// The secrets' checks, on a VM of their own started from the template.
	t.Run("secrets", func(t *testing.T) { secretsStayOnTheHost(t, m) })

	// A clone's later start is a cold boot of its own disk with its own
	// seed: cloud-init does not provision it again (the instance-id is the
	// VM's), and it keeps its identity.
	if _, err := m.Stop(ctx, "tmpl-a"); err != nil {
		t.Fatal(err)
	}
	res := start(t, m, "tmpl-a")
	if res.FromTemplate {
		t.Error("the second start of tmpl-a was from the template")
	}
	code, out, _ := run(t, m, "tmpl-a", "sh", "-c", "cat /etc/machine-id; cut -d' ' -f2 /etc/ssh/ssh_host_ed25519_key.pub; cat /var/lib/agent-vm/reprovision-tried 2>/dev/null; cat /workspace/from-host")
	if want := fa.machineID + "\n" + fa.hostKey + "\ntmpl-a\n"; code != 0 || out != want {
		t.Errorf("tmpl-a after a cold boot: %q, want its machine-id, host key and workspace, and no re-provisioning: %q", out, want)
	}
	// The template's directory records tmpl-a's disk (and tmpl-b's) as
	// users, which keeps the template's disk through a build or removal
	// by another state directory sharing the templates.
	if n := image.LiveUsers(build.Dir); n < 1 {
		t.Errorf("the template's directory records %d users of its disk, want tmpl-a's at least", n)
	}

	// A template another QEMU made: refused, and the new VM boots cold.
	meta := filepath.Join(build.Dir, state.RunDir, qemu.StateMeta)
	raw, err := os.ReadFile(meta)
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	if err := json.Unmarshal(raw, &rec); err != nil {
		t.Fatal(err)
	}
	rec["qemu"] = "6.0.0"
	raw, _ = json.Marshal(rec)
	if err := os.WriteFile(meta, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	// Only the choice is checked here, not the cold first boot that
	// follows it (every other test makes one): the start is given a
	// second, so it fails waiting for SSH, and the QEMU it left running is
	// the VM's own cold boot (no -incoming: no saved state to load).
	c := create(t, m, "tmpl-c")
	if _, err := m.Start(ctx, "tmpl-c", vm.StartOptions{Timeout: time.Second}); err == nil || !strings.Contains(err.Error(), "waiting for SSH") {
		t.Errorf("tmpl-c's start with a 1 s timeout: %v, want it to time out waiting for SSH", err)
	}
	if !strings.Contains(logs.String(), "booting cold, not from the template: the template was saved by QEMU 6.0.0") {
		t.Errorf("no one-line reason for the cold boot in the log:\n%s", logs.String())
	}
	pid := m.Status(ctx, c, false).Pid
	argv, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	switch {
	case pid <= 0 || err != nil:
		t.Errorf("tmpl-c's QEMU (pid %d) is not running after its start: %v", pid, err)
	case strings.Contains(string(argv), "\x00-incoming\x00"):
		t.Errorf("tmpl-c's QEMU waits for a saved state (a template QEMU 6.0.0 saved): %q", argv)
	case !strings.Contains(string(argv), filepath.Join(c.Layout.Dir, "disk.qcow2")):
		t.Errorf("tmpl-c's QEMU does not boot tmpl-c's own disk: %q", argv)
	}
	if pid > 0 {
		_ = syscall.Kill(pid, syscall.SIGKILL) // no guest to shut down yet
	}

	// tmpl-a runs, booted cold from its own disk: a VM as any other.
	t.Run("checkpoints", func(t *testing.T) { checkpointsAsTheAgentWorks(t, m, a) })
	t.Run("fork", func(t *testing.T) { forkStartsAsItself(t, m, a, &logs) })
	t.Run("pause", func(t *testing.T) { suspendPausesABusyVM(t, m, a) })
}

// templates are the templates' commands over m, as cli runs them
// (wire.Templates).
func templates(m *vm.Manager) template.Templates {
	return template.Templates{VMs: m, Dir: m.TemplateDir, Log: m.Log, Now: m.Now}
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
