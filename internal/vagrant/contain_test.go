package vagrant

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/execx/execxtest"
	"github.com/agent-vm/agent-vm/internal/libvirtnet"
	"github.com/agent-vm/agent-vm/internal/libvirtnet/libvirtnettest"
	"github.com/agent-vm/agent-vm/internal/testutil"
)

// A contained start at the exec boundary, with FAKE virsh, nft and egress
// proxy (libvirtnettest) beside the rig's FAKE vagrant: where the driver
// makes the network and tears it down in a machine's life.
// internal/libvirtnet's tests check what Contain asks of each; the
// integration test's vagrant runs check a real guest's reach.
type netRig struct {
	*rig
	host *libvirtnettest.Host
}

func newNetRig(t *testing.T) *netRig {
	// As root, as contained starts are: the proxy's directory is given
	// to the workspace's owner (the rig's 65534).
	testutil.Need(t, os.Geteuid() == 0, "a contained start runs as root")
	r := &netRig{rig: newRig(t)}
	r.d.Euid = func() int { return 0 }
	dir := filepath.Join(filepath.Dir(r.m.RunDir), "net")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	r.m.Network = libvirtnettest.Network(dir)
	r.host = libvirtnettest.New(r.fake)
	r.host.OtherVirsh = func(c execxtest.Call) execxtest.Reply {
		if c.Args[2] == "domstate" {
			return execxtest.Reply{Stdout: "shut off (shutdown)\n"}
		}
		return execxtest.Reply{Stderr: "unexpected", ExitCode: 2}
	}
	return r
}

func TestContainedLifecycle(t *testing.T) {
	r := newNetRig(t)
	ctx := context.Background()
	name := "agent-vm-feat-0123abcd"
	if _, err := r.d.Start(ctx, r.m, boot, driver.StartOptions{Accel: "tcg"}); err != nil {
		t.Fatal(err)
	}
	if !r.host.Nets[name] || len(r.host.Proxies) != 1 || !strings.HasSuffix(strings.Join(r.host.Proxies[0].Args, " "), "--run-as 65534:65534") {
		t.Fatalf("no running network %s (%v), or its proxy did not drop to the workspace's owner: %v", name, r.host.Nets, r.host.Proxies)
	}
	vf, _ := os.ReadFile(filepath.Join(Project(r.m.RunDir), "Vagrantfile"))
	if !strings.Contains(string(vf), `libvirt.management_network_name = "`+name+`"`) ||
		!regexp.MustCompile(`libvirt.management_network_address = "10\.213\.[0-9.]+/29"`).Match(vf) ||
		!strings.Contains(string(vf), `libvirt.management_network_mode = "none"`) || !strings.Contains(string(vf), "libvirt.management_network_keep = true") {
		t.Errorf("the Vagrantfile does not attach the VM's own network:\n%s", vf)
	}
	// The network and the fence come before vagrant up.
	order := r.verbs()
	up := slices.IndexFunc(order, func(v string) bool { return strings.HasPrefix(v, "up ") })
	fence := slices.IndexFunc(order, func(v string) bool { return v == "-f -" })
	if up < 0 || fence < 0 || fence > up {
		t.Errorf("calls in order: %q", order)
	}
	if err := r.d.Stop(ctx, r.m, 0); err != nil {
		t.Fatal(err)
	}
	if len(r.host.Nets) != 0 || len(r.host.Rules) != 2 || !strings.Contains(r.host.Rules[1], "delete table inet agent_vm_0123abcd") {
		t.Errorf("after stop: networks %v, nft given %q", r.host.Nets, r.host.Rules)
	}
	if exists(runFile(r.m, libvirtnet.ContainedMark)) || exists(runFile(r.m, libvirtnet.FrontPorts)) {
		t.Error("stop left the contained network's files")
	}
	// A destroy of a stopped machine has nothing of it left to remove.
	before := len(r.host.Rules)
	if err := r.d.Destroy(ctx, r.m); err != nil {
		t.Fatal(err)
	}
	if len(r.host.Rules) != before {
		t.Errorf("destroy ran nft again: %q", r.host.Rules[before:])
	}
}

// A proxy that cannot start fails the start before vagrant runs, and
// nothing of the contained network is left; as another user than root a
// contained start is refused before anything runs.
func TestContainedStartFailures(t *testing.T) {
	r := newNetRig(t)
	r.host.ProxyUp = false
	_, err := r.d.Start(context.Background(), r.m, boot, driver.StartOptions{Accel: "tcg"})
	if err == nil || !strings.Contains(err.Error(), "starting agent-vm-feat: the egress proxy exited at once") || !strings.Contains(err.Error(), "cannot listen") {
		t.Fatalf("start with a failing proxy: %v", err)
	}
	if len(r.host.Nets) != 0 || len(r.host.Rules) != 1 || !strings.Contains(r.host.Rules[0], "delete table") {
		t.Errorf("left: networks %v, nft given %q", r.host.Nets, r.host.Rules)
	}
	if slices.ContainsFunc(r.verbs(), func(v string) bool { return strings.HasPrefix(v, "up ") }) || exists(runFile(r.m, libvirtnet.ContainedMark)) {
		t.Errorf("vagrant up ran, or the marker stayed: %q", r.verbs())
	}

	r = newNetRig(t)
	r.d.Euid = func() int { return 1000 }
	_, err = r.d.Start(context.Background(), r.m, boot, driver.StartOptions{Accel: "tcg"})
	if !errors.Is(err, errNeedsRoot) || len(r.fake.Calls()) != 0 {
		t.Errorf("a contained start as user 1000: %v, calls %q", err, r.verbs())
	}
}
