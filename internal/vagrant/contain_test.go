package vagrant

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/execx/execxtest"
	"github.com/agent-vm/agent-vm/internal/testutil"
)

// A contained start at the exec boundary, with FAKE virsh, nft and egress
// proxy (execxtest) beside the rig's FAKE vagrant: what the driver asks of
// each and in which order. internal/libvirtnet's tests run the network
// and the fence for real; the integration test's vagrant runs check a
// real guest's reach.
type netRig struct {
	*rig
	nets    map[string]bool // libvirt networks, defined -> active
	rules   []string        // what nft was given
	proxyUp bool            // the fake proxy writes its ports file
}

func newNetRig(t *testing.T) *netRig {
	// As root, as contained starts are: the proxy's directory is given
	// to the workspace's owner (the rig's 65534).
	testutil.Need(t, os.Geteuid() == 0, "a contained start runs as root")
	r := &netRig{rig: newRig(t), nets: map[string]bool{}, proxyUp: true}
	r.d.Euid = func() int { return 0 }
	dir := filepath.Join(filepath.Dir(r.m.RunDir), "net")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	r.m.Network = &driver.Network{Addr: "10.0.2.100", ProxyPort: 3128, Exposed: []int{8080}, Dir: dir,
		Proxy: []string{"/fake/agent-vm", "net-proxy", "--dir", dir}, ProxyInput: driver.Sealed("the bundle")}
	name := regexp.MustCompile(`<name>([^<]+)</name>`)
	r.fake.On("virsh", func(c execxtest.Call) execxtest.Reply {
		args := c.Args[2:]
		switch args[0] {
		case "net-info":
			if active, ok := r.nets[args[1]]; ok {
				return execxtest.Reply{Stdout: "Name: " + args[1] + "\nActive: " + map[bool]string{true: "yes", false: "no"}[active] + "\n"}
			}
			return execxtest.Reply{Stderr: "error: network not found", ExitCode: 1}
		case "net-define":
			r.nets[string(name.FindSubmatch(c.Stdin)[1])] = false
		case "net-start":
			r.nets[args[1]] = true
		case "net-destroy":
			r.nets[args[1]] = false
		case "net-undefine":
			delete(r.nets, args[1])
		case "domstate":
			return execxtest.Reply{Stdout: "shut off (shutdown)\n"}
		default:
			return execxtest.Reply{Stderr: "unexpected", ExitCode: 2}
		}
		return execxtest.Reply{}
	}).On("nft", func(c execxtest.Call) execxtest.Reply {
		r.rules = append(r.rules, string(c.Stdin))
		return execxtest.Reply{}
	}).On("agent-vm", func(c execxtest.Call) execxtest.Reply {
		if !r.proxyUp {
			_ = os.WriteFile(c.Stdout, []byte("net-proxy: cannot listen\n"), 0o600)
			return execxtest.Reply{ExitCode: 1}
		}
		i := slices.Index(c.Args, "--front-ports")
		b, _ := json.Marshal(egress.FrontPorts{Addr: c.Args[slices.Index(c.Args, "--front")+1], Proxy: 40001, Doors: map[int]int{8080: 40002}})
		_ = os.WriteFile(c.Args[i+1], b, 0o600)
		return execxtest.Reply{}
	})
	return r
}

func (r *netRig) calls(prog string) []string {
	var out []string
	for _, c := range r.fake.Calls() {
		if filepath.Base(c.Path) == prog {
			out = append(out, strings.Join(c.Args, " "))
		}
	}
	return out
}

func TestContainedLifecycle(t *testing.T) {
	r := newNetRig(t)
	ctx := context.Background()
	name := "agent-vm-feat-0123abcd"
	if _, err := r.d.Start(ctx, r.m, boot, driver.StartOptions{Accel: "tcg"}); err != nil {
		t.Fatal(err)
	}
	if !r.nets[name] {
		t.Fatalf("no running network %s: %v", name, r.nets)
	}
	proxy := r.calls("agent-vm")
	if len(proxy) != 1 || !strings.Contains(proxy[0], "--front 10.213.") || !strings.Contains(proxy[0], "--front-door 8080") ||
		!strings.Contains(proxy[0], "--front-ports "+filepath.Join(r.m.RunDir, FrontPorts)) || !strings.HasSuffix(proxy[0], "--run-as 65534:65534") {
		t.Errorf("the proxy ran as %q", proxy)
	}
	for _, c := range r.fake.Calls() {
		if filepath.Base(c.Path) == "agent-vm" && string(c.Stdin) != "the bundle" {
			t.Errorf("the proxy's stdin is %q, want the secrets' bundle", c.Stdin)
		}
	}
	if len(r.rules) != 1 || !strings.Contains(r.rules[0], "table inet agent_vm_0123abcd {") ||
		!regexp.MustCompile(`ip daddr 10\.0\.2\.100 tcp dport 3128 dnat ip to 10\.213\.[0-9.]+:40001`).MatchString(r.rules[0]) ||
		!regexp.MustCompile(`ip daddr 10\.0\.2\.100 tcp dport 8080 dnat ip to 10\.213\.[0-9.]+:40002`).MatchString(r.rules[0]) {
		t.Errorf("the fence:\n%s", strings.Join(r.rules, "\n---\n"))
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
	if len(r.nets) != 0 || len(r.rules) != 2 || !strings.Contains(r.rules[1], "delete table inet agent_vm_0123abcd") {
		t.Errorf("after stop: networks %v, nft given %q", r.nets, r.rules)
	}
	if exists(runFile(r.m, ContainedMark)) || exists(runFile(r.m, FrontPorts)) {
		t.Error("stop left the contained network's files")
	}
	// A destroy of a stopped machine has nothing of it left to remove.
	before := len(r.rules)
	if err := r.d.Destroy(ctx, r.m); err != nil {
		t.Fatal(err)
	}
	if len(r.rules) != before {
		t.Errorf("destroy ran nft again: %q", r.rules[before:])
	}
}

// A proxy that cannot start fails the start before vagrant runs, and
// nothing of the contained network is left; as another user than root a
// contained start is refused before anything runs.
func TestContainedStartFailures(t *testing.T) {
	r := newNetRig(t)
	r.proxyUp = false
	_, err := r.d.Start(context.Background(), r.m, boot, driver.StartOptions{Accel: "tcg"})
	if err == nil || !strings.Contains(err.Error(), "egress proxy exited at once") || !strings.Contains(err.Error(), "cannot listen") {
		t.Fatalf("start with a failing proxy: %v", err)
	}
	if len(r.nets) != 0 || len(r.rules) != 1 || !strings.Contains(r.rules[0], "delete table") {
		t.Errorf("left: networks %v, nft given %q", r.nets, r.rules)
	}
	if slices.ContainsFunc(r.verbs(), func(v string) bool { return strings.HasPrefix(v, "up ") }) || exists(runFile(r.m, ContainedMark)) {
		t.Errorf("vagrant up ran, or the marker stayed: %q", r.verbs())
	}

	r = newNetRig(t)
	r.d.Euid = func() int { return 1000 }
	_, err = r.d.Start(context.Background(), r.m, boot, driver.StartOptions{Accel: "tcg"})
	if !errors.Is(err, errNeedsRoot) || len(r.fake.Calls()) != 0 {
		t.Errorf("a contained start as user 1000: %v, calls %q", err, r.verbs())
	}
}
