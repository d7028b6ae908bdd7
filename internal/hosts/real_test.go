package hosts_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/hostdir"
	"github.com/agent-vm/agent-vm/internal/hostlink"
	"github.com/agent-vm/agent-vm/internal/hosts"
	"github.com/agent-vm/agent-vm/internal/sshx/sshdtest"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
	"github.com/agent-vm/agent-vm/internal/testutil/libvirtd"
	"golang.org/x/crypto/ssh"
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
	ctx := tu.Context(t, "the doctor's checks of this host")
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
		if c.Name == "storage pool" {
			pool = c
		}
	}
	// None yet or agent-vm's own (the libvirt backend's runs here make it);
	// one of its name elsewhere is a finding.
	if r.Pool == nil || r.Pool.Name != "agent-vm" || r.Pool.Dir != "/var/lib/agent-vm/pool" || !pool.OK {
		t.Errorf("pool %+v, its line %+v: want agent-vm's, none yet or in /var/lib/agent-vm/pool", r.Pool, pool)
	}
	if (r.Err() == nil) != r.OK {
		t.Errorf("Err() %v with OK %v", r.Err(), r.OK)
	}
}

// agent-vm's own link, for real: this machine's sshd stand-in
// (internal/sshx/sshdtest, root) and libvirtd as a qemu+ssh host. `host
// link` refuses to pin without the user's word, a fingerprint that is not
// the host's, and a "no"; with the right fingerprint it pins the host's
// key and makes agent-vm's key (0600), which the doctor's link line then
// asks the host to accept, naming the file to install; once installed,
// the line says libvirt answered over the link. A second link keeps the
// key; rm removes every file of the host.
func TestLinkAgainstLocalSSHD(t *testing.T) {
	srv := sshdtest.New(t)
	libvirtd.ForTest(t)
	srv.Start()
	ctx := context.Background()
	cfg := t.TempDir()
	dirs := hostdir.NewTable(hostdir.Roots{}, func(k string) string {
		return map[string]string{"HOME": t.TempDir(), "XDG_CONFIG_HOME": cfg}[k]
	}, os.Geteuid())
	r := &hosts.Registry{Dir: dirs.Hosts}
	uri := fmt.Sprintf("qemu+ssh://%s@127.0.0.1:%d/system", srv.User, srv.Port)
	if _, err := r.Add(ctx, "big", uri); err != nil {
		t.Fatal(err)
	}
	want := ssh.FingerprintSHA256(srv.HostKey.Public)
	files := func() []string {
		ms, _ := filepath.Glob(filepath.Join(dirs.Hosts.Path, "big.*"))
		return ms
	}
	if _, err := r.LinkHost(ctx, "big", hosts.LinkOptions{}); !errors.Is(err, hosts.ErrNotConfirmed) || !strings.Contains(err.Error(), "--host-key "+want) {
		t.Errorf("link without the user's word: %v", err)
	}
	if _, err := r.LinkHost(ctx, "big", hosts.LinkOptions{HostKey: "SHA256:not-it"}); err == nil || !strings.Contains(err.Error(), "presents host key "+want) {
		t.Errorf("link with another fingerprint: %v", err)
	}
	var asked string
	no := func(addr, fp string) (bool, error) { asked = addr + " " + fp; return false, nil }
	if _, err := r.LinkHost(ctx, "big", hosts.LinkOptions{Confirm: no}); !errors.Is(err, hosts.ErrNotConfirmed) || asked != srv.Addr+" "+want {
		t.Errorf("link answered no: %v (asked %q)", err, asked)
	}
	if got := files(); len(got) != 1 {
		t.Fatalf("refusals left files: %q", got)
	}
	res, err := r.LinkHost(ctx, "big", hosts.LinkOptions{HostKey: want})
	if err != nil {
		t.Fatal(err)
	}
	if !res.NewKey || res.Link.Fingerprint != want || !strings.HasPrefix(res.PublicKey, "ssh-ed25519 ") || res.Link.User != srv.User || res.Link.Addr != srv.Addr {
		t.Errorf("link: %+v", res)
	}
	if fi, err := os.Stat(res.Link.KeyFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("agent-vm's key: %v %v", fi, err)
	}
	h, err := r.Get("big")
	if err != nil || h.Link == nil || h.Link.Fingerprint != want {
		t.Fatalf("the host read back: %+v %v", h, err)
	}
	doctor := &hosts.Doctor{Run: execx.OS{}}
	line := func() hosts.Check {
		rep := doctor.Check(ctx, h)
		return rep.Checks[len(rep.Checks)-1]
	}
	if c := line(); c.OK || !strings.Contains(c.Detail, "does not accept agent-vm's key") || !strings.Contains(c.Detail, res.Link.KeyFile+".pub") {
		t.Errorf("the link's line before the key is installed: %+v", c)
	}
	srv.Authorize([]byte(res.PublicKey))
	if c := line(); !c.OK || !strings.Contains(c.Detail, want) || !regexp.MustCompile(`libvirt [0-9]+\.[0-9]+\.[0-9]+ over it`).MatchString(c.Detail) {
		t.Errorf("the link's line once the key is installed: %+v", c)
	}
	// The checks asked on the host over the link (as `host doctor` does
	// once it is set up): virsh there against its system daemon, and
	// virtiofsd found there; no ssh of the user's.
	c, err := hostlink.Dial(ctx, h.Link.Target())
	if err != nil {
		t.Fatal(err)
	}
	onHost := (&hosts.Doctor{Run: hostlink.Runner{C: c}, OnHost: true}).Check(ctx, h)
	c.Close()
	byName := map[string]hosts.Check{}
	for _, ch := range onHost.Checks {
		byName[ch.Name] = ch
	}
	if !onHost.Reachable || !byName["libvirt"].OK || !strings.HasSuffix(byName["virtiofsd"].Detail, " on the host") {
		t.Errorf("the checks over the link: %+v", onHost)
	}
	again, err := r.LinkHost(ctx, "big", hosts.LinkOptions{HostKey: want})
	if err != nil || again.NewKey || again.PublicKey != res.PublicKey {
		t.Errorf("a second link: %+v %v; want the same key kept", again, err)
	}
	if err := r.Remove("big"); err != nil {
		t.Fatal(err)
	}
	if got := files(); len(got) != 0 {
		t.Errorf("rm left %q", got)
	}
}
