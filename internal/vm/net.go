package vm

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strconv"

	"github.com/agent-vm/agent-vm/internal/atomicfile"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/hostsetup"
	"github.com/agent-vm/agent-vm/internal/netpolicy"
	"github.com/agent-vm/agent-vm/internal/sshx"
	"github.com/agent-vm/agent-vm/internal/state"
)

// The network policy and its commands are internal/netpolicy's; a start
// hands the driver the network below.

// network is the contained network of a start: the proxy's policy written,
// the doors of the exposed ports, and this agent-vm binary as proxy and
// relay.
func (m *Manager) network(r *state.Record, l state.Layout) (*driver.Network, error) {
	pins, err := m.Pins()
	if err != nil {
		return nil, err
	}
	if err := netpolicy.Write(l, r, pins); err != nil {
		return nil, err
	}
	exe := m.Executable
	if exe == nil {
		exe = os.Executable
	}
	self, err := exe()
	if err != nil {
		return nil, fmt.Errorf("finding the agent-vm binary for the egress proxy: %w", err)
	}
	dir := netpolicy.DirOf(l)
	return &driver.Network{Addr: guest.HostAddr, ProxyPort: guest.ProxyPort, Exposed: netpolicy.Policy(r, pins).Exposed, Dir: dir,
		Proxy: []string{self, "net-proxy", "--dir", dir},
		Relay: []string{self, "net-relay"}}, nil
}

// Pins implements netpolicy.PinSource: the host's pins (internal/pins),
// which every VM's policy carries.
func (m *Manager) Pins() ([]egress.Pin, error) { return m.PinFile.Read() }

// PinSources is setup's pins step (hostsetup.Pin, record: not --no-pins);
// when the pins change, the running VMs' proxies get them at once
// (netpolicy.Refresh), and refreshed names those VMs.
func (m *Manager) PinSources(ctx context.Context, record bool) (rep hostsetup.PinReport, refreshed []string, err error) {
	rep, err = hostsetup.Pin(ctx, hostsetup.PinOptions{File: m.PinFile, ImageDir: m.ImageDir(), Record: record})
	if err != nil || !rep.Changed() {
		return rep, nil, err
	}
	es, err := m.List(ctx)
	if err != nil {
		return rep, nil, err
	}
	refreshed, err = netpolicy.Refresh(ctx, m, es)
	return rep, refreshed, err
}

// Contains reports whether r's VM runs contained: its driver contains
// the network (a driver.NetworkContainer) and the guest is agent-vm's (a
// foreign guest, the repository's own Vagrantfile, is on the networks
// that file sets up). A VM whose driver this build lacks is taken as
// contained (nothing else is said of it).
func (m *Manager) Contains(r *state.Record) bool {
	d, err := m.driverOf(r)
	if err != nil {
		return true
	}
	return contains(d, r)
}

// contains: d contains the network of r's VM.
func contains(d driver.Driver, r *state.Record) bool {
	_, ok := d.(driver.NetworkContainer)
	return ok && r.Guest.Foreign == ""
}

// Publish implements netpolicy.VMs: a VM placed on another host gets its
// policy file copied into its proxy's directory there (atomically, given
// to the proxy's user), which the proxy re-reads as it changes.
func (m *Manager) Publish(ctx context.Context, e state.Entry) error {
	mach := m.machine(e.Record, e.Layout)
	if mach.Remote == nil {
		return nil
	}
	b, err := os.ReadFile(filepath.Join(netpolicy.DirOf(e.Layout), egress.PolicyFile))
	if err != nil {
		return err
	}
	l, err := m.linkFor(ctx, mach)
	if err != nil {
		return err
	}
	defer l.Close()
	owner := ""
	if e.Record.Guest.UID > 0 {
		owner = strconv.Itoa(e.Record.Guest.UID) + ":" + strconv.Itoa(e.Record.Guest.GID)
	}
	const put = `umask 077; cat > "$1.tmp" && { [ -z "$2" ] || chown "$2" "$1.tmp"; } && mv -f "$1.tmp" "$1"`
	hp, err := m.hostPaths(e.Record, mach)
	if err != nil {
		return err
	}
	dst := path.Join(hp.NetDir, egress.PolicyFile)
	if _, err := l.git.Run.Run(ctx, execx.Cmd{Path: "sh", Args: []string{"-c", put, "sh", dst, owner}, Stdin: bytes.NewReader(b)}); err != nil {
		return fmt.Errorf("copying the policy to host %s: %w", mach.Remote.Host, err)
	}
	return nil
}

// PullLog implements netpolicy.VMs: for a VM placed on another host, its
// proxy's log there is copied over the local one (which nothing else
// writes), and with follow what the host's log gains is appended to it
// (tail -F there) until stop.
func (m *Manager) PullLog(ctx context.Context, e state.Entry, follow bool) (func(), error) {
	mach := m.machine(e.Record, e.Layout)
	if mach.Remote == nil {
		return func() {}, nil
	}
	local := netpolicy.LogPath(e.Layout)
	hp, err := m.hostPaths(e.Record, mach)
	if err != nil {
		return nil, err
	}
	src := path.Join(hp.NetDir, egress.LogFile)
	l, err := m.linkFor(ctx, mach)
	if err != nil {
		return nil, err
	}
	if !follow {
		defer l.Close()
		res, err := l.git.Run.Run(ctx, execx.Cmd{Path: "sh", Args: []string{"-c", `[ ! -e "$1" ] || cat -- "$1"`, "sh", src}})
		if err != nil {
			return nil, fmt.Errorf("reading the connection log on host %s: %w", mach.Remote.Host, err)
		}
		if err := atomicfile.Write(local, res.Stdout, 0o600); err != nil {
			return nil, err
		}
		return func() {}, nil
	}
	var off int64
	if fi, err := os.Stat(local); err == nil {
		off = fi.Size()
	}
	f, err := os.OpenFile(local, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		l.Close()
		return nil, err
	}
	fctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = sshx.Run(fctx, l.c, sshx.Quote([]string{"tail", "-c", "+" + strconv.FormatInt(off+1, 10), "-F", "--", src}), nil, f, io.Discard)
	}()
	return func() {
		cancel()
		l.Close()
		<-done
		f.Close()
	}, nil
}
