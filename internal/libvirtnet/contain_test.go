package libvirtnet

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/execx/execxtest"
	"github.com/agent-vm/agent-vm/internal/libvirtnet/libvirtnettest"
	"github.com/agent-vm/agent-vm/internal/testutil"
)

// containRig is a contained machine and a Containment over FAKE virsh,
// nft and egress proxy (libvirtnettest, at the exec boundary): what it
// asks of each and what it leaves. TestFenceHoldsForReal runs the network
// and the fence for real.
type containRig struct {
	c    Containment
	m    driver.Machine
	fake *execxtest.Fake
	host *libvirtnettest.Host
}

const containName = "agent-vm-feat-0123abcd"

func newContainRig(t *testing.T, euid int) *containRig {
	dir := t.TempDir()
	m := driver.Machine{Name: "agent-vm-feat", UUID: "0123abcd-1111", RunDir: filepath.Join(dir, "run"), LogsDir: filepath.Join(dir, "logs"),
		Share: driver.Share{Source: filepath.Join(dir, "workspace"), UID: 65534, GID: 65534}, Network: libvirtnettest.Network(filepath.Join(dir, "net"))}
	for _, d := range []string{m.RunDir, m.LogsDir, m.Network.Dir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	fake := execxtest.New(t)
	return &containRig{m: m, fake: fake, host: libvirtnettest.New(fake),
		c: Containment{Libvirt: Libvirt{Run: fake, URI: "qemu:///system"}, Run: fake, Log: hclog.NewNullLogger(), Euid: func() int { return euid }}}
}

func there(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// Contain makes the network, starts the proxy on its bridge's address (dropping
// to the workspace's owner as root) and fences the proxy address to the proxy's
// ports; Uncontain removes all of it, once.
func TestContainLifecycle(t *testing.T) {
	for _, tc := range []struct {
		name  string
		euid  int
		runAs bool
	}{{"as root", 0, true}, {"as another user", 1000, false}} {
		t.Run(tc.name, func(t *testing.T) {
			// As root the network directory is given to the workspace's owner.
			testutil.Need(t, tc.euid != 0 || os.Geteuid() == 0, "the proxy drops to the workspace's owner only as root")
			r := newContainRig(t, tc.euid)
			net, err := r.c.Contain(context.Background(), r.m, containName, "52:54:00:12:34:56")
			if err != nil {
				t.Fatal(err)
			}
			if net.Name != containName || !r.host.Nets[containName] || !Pool.Contains(net.Host) || net.MAC != "52:54:00:12:34:56" {
				t.Fatalf("network %+v; running networks %v", net, r.host.Nets)
			}
			if !there(filepath.Join(r.m.RunDir, ContainedMark)) {
				t.Error("no marker that a start made the network")
			}
			if len(r.host.Proxies) != 1 {
				t.Fatalf("the proxy ran %d times", len(r.host.Proxies))
			}
			p := r.host.Proxies[0]
			args := strings.Join(p.Args, " ")
			if !strings.HasPrefix(args, "__net-proxy --dir "+r.m.Network.Dir+" --front "+net.Host.String()+" --front-ports "+filepath.Join(r.m.RunDir, FrontPorts)+" --front-exposed 8080") ||
				strings.HasSuffix(args, " --run-as 65534:65534") != tc.runAs {
				t.Errorf("the proxy ran as %q", args)
			}
			if string(p.Stdin) != "the bundle" || p.Stdout != filepath.Join(r.m.LogsDir, EgressLog) {
				t.Errorf("the proxy's stdin %q, output %s; want the secrets' bundle, the egress log", p.Stdin, p.Stdout)
			}
			host := regexp.QuoteMeta(net.Host.String())
			if len(r.host.Rules) != 1 || !strings.Contains(r.host.Rules[0], "table inet agent_vm_0123abcd {") ||
				!regexp.MustCompile(`ip daddr 10\.0\.2\.100 tcp dport 3128 dnat ip to `+host+`:40001`).MatchString(r.host.Rules[0]) ||
				!regexp.MustCompile(`ip daddr 10\.0\.2\.100 tcp dport 8080 dnat ip to `+host+`:40002`).MatchString(r.host.Rules[0]) {
				t.Errorf("the fence:\n%s", strings.Join(r.host.Rules, "\n---\n"))
			}

			r.c.Uncontain(r.m, containName)
			if len(r.host.Nets) != 0 || len(r.host.Rules) != 2 || !strings.Contains(r.host.Rules[1], "delete table inet agent_vm_0123abcd") {
				t.Errorf("after Uncontain: networks %v, nft given %q", r.host.Nets, r.host.Rules)
			}
			if there(filepath.Join(r.m.RunDir, ContainedMark)) || there(filepath.Join(r.m.RunDir, FrontPorts)) {
				t.Error("Uncontain left the contained network's files")
			}
			// Without the marker there is nothing left to remove.
			before := len(r.fake.Calls())
			r.c.Uncontain(r.m, containName)
			if calls := r.fake.Calls(); len(calls) != before {
				t.Errorf("a second Uncontain ran %v", calls[before:])
			}
		})
	}
}

// A proxy that cannot start fails Contain, and nothing of the network is
// left; an incomplete network is refused before anything runs.
func TestContainFailures(t *testing.T) {
	r := newContainRig(t, 1000)
	r.host.ProxyUp = false
	_, err := r.c.Contain(context.Background(), r.m, containName, "52:54:00:12:34:56")
	if err == nil || !strings.Contains(err.Error(), "egress proxy exited at once") || !strings.Contains(err.Error(), "cannot listen") {
		t.Fatalf("Contain with a failing proxy: %v", err)
	}
	if len(r.host.Nets) != 0 || len(r.host.Rules) != 1 || !strings.Contains(r.host.Rules[0], "delete table") || there(filepath.Join(r.m.RunDir, ContainedMark)) {
		t.Errorf("left: networks %v, nft given %q, the marker there: %v", r.host.Nets, r.host.Rules, there(filepath.Join(r.m.RunDir, ContainedMark)))
	}

	r = newContainRig(t, 1000)
	r.m.UUID = ""
	_, err = r.c.Contain(context.Background(), r.m, containName, "52:54:00:12:34:56")
	if err == nil || !strings.Contains(err.Error(), "incomplete network") || len(r.fake.Calls()) != 0 || there(filepath.Join(r.m.RunDir, ContainedMark)) {
		t.Errorf("Contain without the machine's uuid: %v, calls %v", err, r.fake.Calls())
	}
}
