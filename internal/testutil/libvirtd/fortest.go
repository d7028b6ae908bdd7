package libvirtd

import (
	"context"
	"testing"

	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/testutil"
)

// ForTest returns a libvirtd answering on URI for t: the running one, or
// one started here and stopped (with what it started) when t ends. It skips
// t, or fails it under AGENT_VM_TEST_STRICT=1, when a program is missing;
// when t fails, the started daemons' log tails are in its output.
func ForTest(t testing.TB) *Daemon {
	t.Helper()
	o := Options{Run: execx.OS{}, Virsh: testutil.Program(t, Virsh), Libvirtd: testutil.Program(t, Libvirtd),
		Virtlogd: testutil.Program(t, Virtlogd), LogDir: t.TempDir()}
	testutil.Program(t, "dnsmasq") // vagrant-libvirt's network needs it
	d, err := Start(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, log := range d.Logs() {
				t.Logf("%s ends:\n%s", log, tail(log))
			}
		}
		if err := d.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return d
}
