package hosts_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/hosts"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
	"github.com/agent-vm/agent-vm/internal/testutil/libvirtd"
)

// The real doctor, real virsh, against this machine's libvirtd (the
// fixture's, started when none answers): libvirt reachable, nodeinfo's
// numbers above zero, and the pool "default" reported as it is, whatever
// that is here; the pool's line agrees with the facts. Nothing is
// changed on the host.
func TestDoctorAgainstLocalLibvirtd(t *testing.T) {
	if testing.Short() {
		t.Skip("runs virsh against a libvirtd, which the fixture may start")
	}
	tu.Program(t, libvirtd.Virsh)
	if os.Geteuid() != 0 {
		res, err := (execx.OS{}).Run(context.Background(), execx.Cmd{Path: "virsh", Args: []string{"-c", libvirtd.URI, "version"}})
		if err != nil {
			tu.SkipOrFail(t, "no libvirtd answers on %s and only root can start one: %v %s", libvirtd.URI, err, res.Stderr)
		}
	}
	libvirtd.ForTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	r := (&hosts.Doctor{Run: execx.OS{}}).Check(ctx, hosts.Host{Name: "here", URI: libvirtd.URI})
	for _, c := range r.Checks {
		t.Logf("%v %-22s %s %s", c.OK, c.Name, c.Detail, c.Hint)
	}
	if !r.Reachable || len(r.Checks) != 6 || r.Checks[0].Name != "libvirt" || !r.Checks[0].OK || !strings.Contains(r.Checks[0].Detail, "libvirt") {
		t.Fatalf("libvirt not reported reachable: %+v", r)
	}
	if r.Node == nil || r.Node.CPUs <= 0 || r.Node.MemoryKiB == 0 {
		t.Errorf("nodeinfo: %+v", r.Node)
	}
	if r.Accel != "kvm" && r.Accel != "tcg" {
		t.Errorf("accel %q, want kvm or tcg", r.Accel)
	}
	var pool hosts.Check
	for _, c := range r.Checks {
		if c.Name == "storage pool "+hosts.DefaultPool {
			pool = c
		}
	}
	switch {
	case r.Pool == nil:
		t.Errorf("no pool state; its line: %+v", pool)
	case r.Pool.Active != pool.OK, r.Pool.Active && !r.Pool.Exists:
		t.Errorf("pool %+v disagrees with its line %+v", r.Pool, pool)
	case !r.Pool.Exists && !strings.Contains(pool.Hint, "pool-define-as"):
		t.Errorf("no pool default, and the hint says not how to make it: %+v", pool)
	case r.Pool.Exists && !r.Pool.Active && !strings.Contains(pool.Hint, "pool-start"):
		t.Errorf("pool default inactive, and the hint says not how to start it: %+v", pool)
	}
	if (r.Err() == nil) != r.OK {
		t.Errorf("Err() %v with OK %v", r.Err(), r.OK)
	}
}
