package hold

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/crypto/ssh"

	"github.com/agent-vm/agent-vm/internal/execx"
)

// A ReverseForward is a forward the holder keeps on its connection to the guest:
// the guest's sshd listens, at a unix socket path (OpenSSH's streamlocal-forward)
// or on the guest's 127.0.0.1:port (tcpip-forward), and each connection a guest
// program makes there comes back over the held connection to Serve, in the
// holder. The guest's sshd makes the socket as the login user, mode 0600 (its
// StreamLocalBindMask), and binds a port on the guest's loopback only
// (GatewayPorts no): only the guest's own programs reach a reverse forward, and
// only through it the host.
//
// Reverse forwards belong to the holder because they last while the VM runs, as
// the holder does, and need no port on the host: the guest side opens nothing
// towards the host but these channels on a connection the host made.
type ReverseForward struct {
	// Name says what the reverse forward is, in the holder's log and in errors.
	Name string
	// GuestSocket is the unix socket path the guest listens on; else
	// GuestPort, a port on the guest's 127.0.0.1.
	GuestSocket string
	GuestPort   int
	// Prepare is a shell command run in the guest, as the login user,
	// before the forward is asked for: making the socket's directory,
	// removing a stale socket a holder before this one left (sshd does
	// not bind over a file unless StreamLocalBindUnlink is set).
	Prepare string
	// Serve handles one connection the guest made; it owns c.
	Serve func(ctx context.Context, c net.Conn)
}

func (d ReverseForward) guestAddr() string {
	if d.GuestSocket != "" {
		return d.GuestSocket
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(d.GuestPort))
}

// ReloadRequest is the global request a caller sends the holder to have it read
// its reverse forwards again (Holder.ReverseForwards) and open them: those no
// longer wanted close, the others open anew. The reply's payload is the error's
// text when it fails.
const ReloadRequest = "reload-forwards@agent-vm"

// reverseForwards are the forwards a holder keeps open.
type reverseForwards struct {
	mu   sync.Mutex
	open []opened
	log  hclog.Logger
}

type opened struct {
	l net.Listener
	d ReverseForward
}

// apply closes the open reverse forwards and opens want on c. A reverse forward
// that fails does not keep the others shut: each error is joined into the result.
func (ds *reverseForwards) apply(ctx context.Context, c *ssh.Client, want []ReverseForward) error {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	ds.close(c)
	var errs []error
	for _, d := range want {
		l, err := openReverse(c, d)
		if err != nil {
			errs = append(errs, fmt.Errorf("opening the %s reverse forward at the guest's %s: %w", d.Name, d.guestAddr(), err))
			continue
		}
		ds.open = append(ds.open, opened{l, d})
		ds.log.Info("reverse forward open", "forward", d.Name, "guest", d.guestAddr())
		go ds.accept(ctx, l, d)
	}
	return errors.Join(errs...)
}

// close closes the open reverse forwards; the sockets of socket forwards, which
// the guest's sshd leaves behind when a forward is cancelled, are removed (c nil:
// the connection is going, and the guest's /tmp with it at its next boot), so no
// guest program finds a socket that leads nowhere.
func (ds *reverseForwards) close(c *ssh.Client) {
	for _, o := range ds.open {
		o.l.Close() // cancels the forward
		if c == nil || o.d.GuestSocket == "" {
			continue
		}
		if s, err := c.NewSession(); err == nil {
			if err := s.Run("rm -f -- " + execx.ShellQuote(o.d.GuestSocket)); err != nil {
				ds.log.Debug("removing a closed reverse forward's socket", "forward", o.d.Name, "error", err)
			}
			s.Close()
		}
	}
	ds.open = nil
}

func openReverse(c *ssh.Client, d ReverseForward) (net.Listener, error) {
	if d.Prepare != "" {
		s, err := c.NewSession()
		if err != nil {
			return nil, err
		}
		out, err := s.CombinedOutput(d.Prepare)
		s.Close()
		if err != nil {
			return nil, fmt.Errorf("preparing it: %v: %s", err, out)
		}
	}
	if d.GuestSocket != "" {
		return c.ListenUnix(d.GuestSocket)
	}
	return c.Listen("tcp", d.guestAddr())
}

// accept serves the connections of one reverse forward until it closes.
func (ds *reverseForwards) accept(ctx context.Context, l net.Listener, d ReverseForward) {
	for {
		conn, err := l.Accept()
		if err != nil {
			ds.log.Debug("reverse forward closed", "forward", d.Name, "reason", err)
			return
		}
		go d.Serve(ctx, conn)
	}
}

func (ds *reverseForwards) closeAll() {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	ds.close(nil)
}

// Reload has the holder of f read its reverse forwards again and open them
// (ReloadRequest). ErrNoHolder when none serves: reverse forwards live in a
// holder.
func Reload(ctx context.Context, f Files, user string) error {
	c, err := Dial(ctx, f, user, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	ok, msg, err := c.SendRequest(ReloadRequest, true, nil)
	if err != nil {
		return fmt.Errorf("asking the holder to open the reverse forwards: %w", err)
	}
	if !ok {
		if len(msg) == 0 {
			// What a holder says to a request it does not know: one an
			// older agent-vm started, which took this request by another
			// name.
			return errors.New("the holder refused to open the reverse forwards: it says why in its log, or it was started by an older agent-vm, which asked for them by another name (hint: a new start of the VM starts a new holder)")
		}
		return errors.New(string(msg))
	}
	return nil
}
