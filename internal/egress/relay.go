package egress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-vm/agent-vm/internal/sockdir"
)

// Socket names in a VM's socket directory.
const (
	ProxySocket   = "egress.sock"
	ExposedSocket = "exposed.sock"
)

// Relay carries one guest connection, which QEMU hands to the relay
// process as its stdin and stdout (guestfwd's cmd: a socket pair), to the
// proxy's unix socket sock. port > 0 makes it a connection to that exposed
// host port (the preamble the exposed-port socket expects).
//
// QEMU also connects the relay's stderr to the guest's connection, so the
// relay never writes to it: failures are only its exit status.
func Relay(ctx context.Context, sock string, port int, in io.Reader, out io.Writer) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return fmt.Errorf("reaching the VM's egress proxy: %w", err)
	}
	defer c.Close()
	uc := c.(*net.UnixConn)
	if port > 0 {
		if _, err := io.WriteString(uc, strconv.Itoa(port)+"\n"); err != nil {
			return err
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(uc, in)
		_ = uc.CloseWrite()
	}()
	_, err = io.Copy(out, uc)
	if f, ok := out.(*os.File); ok {
		_ = f.Close()
	}
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// Listen makes the proxy's and the exposed ports' unix sockets (0600 from their
// first moment, replacing stale ones); Serve serves them.
func Listen(proxySock, exposedSock string) ([]net.Listener, error) {
	var ls []net.Listener
	for _, s := range []string{proxySock, exposedSock} {
		_ = os.Remove(s)
		l, err := sockdir.Listen(s, 0o600)
		if err != nil {
			for _, l := range ls {
				l.Close()
			}
			if l != nil {
				l.Close()
			}
			return nil, err
		}
		ls = append(ls, l)
	}
	return ls, nil
}

// Serve serves the listeners Listen made until ctx ends, and closes them.
func (p *Proxy) Serve(ctx context.Context, ls []net.Listener) error {
	return p.serve(ctx, ls, nil)
}

// serve is Serve with the TCP front f too (nil: none).
func (p *Proxy) serve(ctx context.Context, ls []net.Listener, f *front) error {
	// An earlier proxy's asks ended with it: none is pending now, and
	// answers to them are moot.
	p.writeAsks()
	_ = p.Dir.Remove(AnswersFile)
	defer func() {
		_ = p.Dir.Remove(AsksFile) // the held connections end with the proxy
		for _, l := range ls {
			l.Close()
		}
		f.close()
	}()
	n := len(ls)
	if f != nil {
		n += 1 + len(f.exposed)
	}
	errc := make(chan error, n)
	if len(ls) == 2 {
		go func() { errc <- p.ServeProxy(ls[0]) }()
		go func() { errc <- p.ServeExposed(ls[1]) }()
	}
	if f != nil {
		p.serveFront(f, errc)
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		return err
	}
}

// Run is Listen, then Serve.
func (p *Proxy) Run(ctx context.Context, proxySock, exposedSock string) error {
	ls, err := Listen(proxySock, exposedSock)
	if err != nil {
		return err
	}
	return p.Serve(ctx, ls)
}

// WaitPid waits for the pid file of the VM's QEMU, which starts after its
// proxy, and returns its pid; after grace without one it fails (QEMU never
// started: the proxy must not stay).
func WaitPid(ctx context.Context, pidFile string, grace time.Duration) (int, error) {
	deadline := time.Now().Add(grace)
	for {
		b, err := os.ReadFile(pidFile)
		if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && perr == nil && pid > 0 {
			return pid, nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("no QEMU pid in %s within %s", pidFile, grace)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Orphaned returns a context that ends with ctx or once process pid (the
// VM's QEMU) is gone: its proxy must not outlive it. It holds a pidfd, so
// it needs no access to the VM's files and a recycled pid is never taken
// for the QEMU; on kernels without pidfds it polls the pid.
func Orphaned(ctx context.Context, pid int) context.Context {
	ctx, cancel := context.WithCancel(ctx)
	fd, err := unix.PidfdOpen(pid, 0)
	go func() {
		defer cancel()
		if err == nil {
			defer unix.Close(fd)
		}
		for ctx.Err() == nil {
			if err == nil {
				fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
				if n, perr := unix.Poll(fds, 1000); perr == nil && n > 0 {
					return // the process exited
				}
				continue
			}
			if syscall.Kill(pid, 0) == syscall.ESRCH {
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}()
	return ctx
}

// DropPrivileges makes the process uid:gid for good (real, effective and
// saved ids of every thread; no supplementary groups), for a proxy started
// by a root agent-vm for a VM whose QEMU runs as the workspace's owner:
// what parses the guest's requests is never root.
func DropPrivileges(uid, gid int) error {
	if err := syscall.Setgroups(nil); err != nil {
		return fmt.Errorf("dropping groups: %w", err)
	}
	if err := syscall.Setresgid(gid, gid, gid); err != nil {
		return fmt.Errorf("becoming group %d: %w", gid, err)
	}
	if err := syscall.Setresuid(uid, uid, uid); err != nil {
		return fmt.Errorf("becoming user %d: %w", uid, err)
	}
	if os.Getuid() != uid || os.Geteuid() != uid || os.Getegid() != gid {
		return fmt.Errorf("still uid %d/%d gid %d after dropping to %d:%d", os.Getuid(), os.Geteuid(), os.Getegid(), uid, gid)
	}
	return nil
}
