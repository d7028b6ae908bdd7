package egress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
)

// TestHostsEnv names test names the egress proxy resolves itself
// ("name=ip,..."): how tests lead an allowed name to a server on the
// host. Not for users. It overrides name resolution only: the proxy checks
// its answers as any name's, so a test that leads a name to the host's
// loopback also allows 127.0.0.1 itself.
const TestHostsEnv = "AGENT_VM_TEST_EGRESS_HOSTS"

// ServeOptions are the hidden `net-proxy` command's flags.
type ServeOptions struct {
	Dir string // the VM's network directory (policy, log)
	// ProxySocket and ExposedSocket are the unix sockets QEMU's relays reach the
	// proxy and the exposed ports at; both "" when Front serves alone.
	ProxySocket   string
	ExposedSocket string
	QEMUPidFile   string // exit once its process is gone
	RunAs         string // "UID:GID" to drop to before serving; "" keeps the caller's
	TestHosts     string // TestHostsEnv's value
	// Secrets, when set, is the Bundle agent-vm writes to the proxy's
	// standard input: the proxy then intercepts the hosts its secrets
	// are bound to.
	Secrets    io.Reader
	TestRootCA string // TestRootCAEnv's value
	// Front, when set, is the proxy's TCP front (a guest on a libvirt
	// network of its own); its listeners open before privileges drop.
	Front *Front
	// ExposedDir is Proxy.ExposedDir: where exposed ports are reached, as unix
	// sockets, instead of this host's 127.0.0.1.
	ExposedDir string
	Log        hclog.Logger
}

// Serve runs a VM's egress proxy (the hidden `net-proxy` command the
// driver starts) until ctx ends or the VM's QEMU is gone: it listens, waits
// for QEMU's pid, drops to o.RunAs, then serves (see internal/egress's
// doc on privileges).
func Serve(ctx context.Context, o ServeOptions) error {
	p := &Proxy{Logger: o.Log, ExposedDir: o.ExposedDir}
	hosts, runAs, pidFile := o.TestHosts, o.RunAs, o.QEMUPidFile
	if hosts != "" {
		p.Hosts = map[string]netip.Addr{}
		for _, kv := range strings.Split(hosts, ",") {
			name, addr, _ := strings.Cut(kv, "=")
			a, err := netip.ParseAddr(addr)
			if err != nil {
				return fmt.Errorf("%s: %q is not name=address", TestHostsEnv, kv)
			}
			p.Hosts[strings.ToLower(name)] = a
		}
	}
	if o.Secrets != nil {
		ic, err := ReadBundle(o.Secrets, o.TestRootCA)
		if err != nil {
			return err
		}
		p.Intercept = ic
	}
	var uid, gid int
	if runAs != "" {
		if _, err := fmt.Sscanf(runAs, "%d:%d", &uid, &gid); err != nil || uid <= 0 || gid < 0 {
			return fmt.Errorf("--run-as %q is not UID:GID of a user other than root", runAs)
		}
	}
	root, err := os.OpenRoot(o.Dir)
	if err != nil {
		return fmt.Errorf("the VM's network directory: %w", err)
	}
	defer root.Close()
	p.Dir, p.Log = root, &Log{Dir: root, Name: LogFile}
	var ls []net.Listener
	switch {
	case o.ProxySocket != "" && o.ExposedSocket != "":
		if ls, err = Listen(o.ProxySocket, o.ExposedSocket); err != nil {
			return err
		}
	case o.Front == nil || o.ProxySocket != "" || o.ExposedSocket != "":
		return errors.New("the egress proxy needs both its sockets, or a TCP front")
	}
	var f *front
	if o.Front != nil {
		if f, err = listenFront(*o.Front); err != nil {
			for _, l := range ls {
				l.Close()
			}
			return err
		}
	}
	if pidFile != "" {
		pid, err := WaitPid(ctx, pidFile, 2*time.Minute)
		if err != nil {
			return err
		}
		ctx = Orphaned(ctx, pid)
	}
	if runAs != "" {
		if err := DropPrivileges(uid, gid); err != nil {
			return err
		}
	}
	return p.serve(ctx, ls, f)
}

// GiveDir makes a VM's network directory and what is in it uid:gid's,
// for a proxy that drops to that user (ServeOptions.RunAs): a link is
// never followed, a directory inside is not entered, modes stay.
func GiveDir(dir string, uid, gid int) error {
	if dir == "" {
		return errors.New("internal error: the network has no directory")
	}
	if err := os.Lchown(dir, uid, gid); err != nil {
		return err
	}
	des, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, de := range des {
		if err := os.Lchown(filepath.Join(dir, de.Name()), uid, gid); err != nil {
			return err
		}
	}
	return nil
}
