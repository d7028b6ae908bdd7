package harness

import (
	"context"
	"fmt"
	"net"
	"net/http"
)

// Servers on this host for the scenarios to reach, or to find unreachable,
// from a guest.

// HostServer serves body on a free port of the host's 127.0.0.1 until ctx
// ends (or the test program does).
func HostServer(ctx context.Context, body string) (int, error) {
	return HostServerOn(ctx, "127.0.0.1", body)
}

// HostServerOn is HostServer on addr (0.0.0.0: all of the host's
// addresses, only for as long as the step needs it).
func HostServerOn(ctx context.Context, addr, body string) (int, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		return 0, err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, body) })}
	go srv.Serve(ln)
	go func() { <-ctx.Done(); srv.Close() }()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// HostAddrs are the host's own IPv4 addresses other than loopback (the
// LAN's, Docker's bridges', ...).
func HostAddrs() ([]string, error) {
	as, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, a := range as {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() {
			out = append(out, n.IP.String())
		}
	}
	return out, nil
}

// Unreachable checks, as root in branch's guest, that no TCP connection
// to host port p opens at the gateway or at the proxy address (QEMU's
// user network), nor, for a VM on a libvirt network (the vagrant and
// libvirt backends), at any of the host's own addresses, the VMs' libvirt
// bridges among them.
func (s *S) Unreachable(ctx context.Context, branch string, p int) error {
	addrs := []string{"10.0.2.2", "10.0.2.100"}
	if s.OnLibvirt() {
		own, err := HostAddrs()
		if err != nil {
			return err
		}
		addrs = append(addrs, own...)
	}
	for _, a := range addrs {
		res := s.Exec(ctx, branch, "sudo", "timeout", "15", "bash", "-c", fmt.Sprintf("exec 3<>/dev/tcp/%s/%d", a, p))
		if res.ExitCode == 0 {
			return Failf(res, "the guest of %s opened a connection to the host's port %d at %s", branch, p, a)
		}
	}
	return nil
}
