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

// A Door is a forward the holder keeps on its connection to the guest: the
// guest's sshd listens, at a unix socket path (OpenSSH's
// streamlocal-forward) or on the guest's 127.0.0.1:port (tcpip-forward),
// and each connection a guest program makes there comes back over the
// held connection to Serve, in the holder. The guest's sshd makes the
// socket as the login user, mode 0600 (its StreamLocalBindMask), and binds
// a port on the guest's loopback only (GatewayPorts no): only the guest's
// own programs reach a door, and only through it the host.
//
// Doors belong to the holder because they last while the VM runs, as the
// holder does, and need no port on the host: the guest side opens
// nothing towards the host but these channels on a connection the host
// made.
type Door struct {
	// Name says what the door is, in the holder's log and in errors.
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

func (d Door) guestAddr() string {
	if d.GuestSocket != "" {
		return d.GuestSocket
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(d.GuestPort))
}

// DoorsRequest is the global request a caller sends the holder to have
// it read its doors again (Holder.Doors) and open them: those no longer
// wanted close, the others open anew. The reply's payload is the error's
// text when it fails.
const DoorsRequest = "doors@agent-vm"

// doors are the forwards a holder keeps open.
type doors struct {
	mu   sync.Mutex
	open []opened
	log  hclog.Logger
}

type opened struct {
	l net.Listener
	d Door
}

// apply closes the open doors and opens want on c. A door that fails does
// not keep the others shut: each error is joined into the result.
func (ds *doors) apply(ctx context.Context, c *ssh.Client, want []Door) error {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	ds.close(c)
	var errs []error
	for _, d := range want {
		l, err := openDoor(c, d)
		if err != nil {
			errs = append(errs, fmt.Errorf("opening the %s door at the guest's %s: %w", d.Name, d.guestAddr(), err))
			continue
		}
		ds.open = append(ds.open, opened{l, d})
		ds.log.Info("door open", "door", d.Name, "guest", d.guestAddr())
		go ds.accept(ctx, l, d)
	}
	return errors.Join(errs...)
}

// close closes the open doors; the sockets of socket doors, which the
// guest's sshd leaves behind when a forward is cancelled, are removed
// (c nil: the connection is going, and the guest's /tmp with it at its
// next boot), so no guest program finds a socket that leads nowhere.
func (ds *doors) close(c *ssh.Client) {
	for _, o := range ds.open {
		o.l.Close() // cancels the forward
		if c == nil || o.d.GuestSocket == "" {
			continue
		}
		if s, err := c.NewSession(); err == nil {
			if err := s.Run("rm -f -- " + execx.ShellQuote(o.d.GuestSocket)); err != nil {
				ds.log.Debug("removing a closed door's socket", "door", o.d.Name, "error", err)
			}
			s.Close()
		}
	}
	ds.open = nil
}

func openDoor(c *ssh.Client, d Door) (net.Listener, error) {
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

// accept serves the connections of one door until it closes.
func (ds *doors) accept(ctx context.Context, l net.Listener, d Door) {
	for {
		conn, err := l.Accept()
		if err != nil {
			ds.log.Debug("door closed", "door", d.Name, "reason", err)
			return
		}
		go d.Serve(ctx, conn)
	}
}

func (ds *doors) closeAll() {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	ds.close(nil)
}

// Reload has the holder of f read its doors again and open them
// (DoorsRequest). ErrNoHolder when none serves: doors live in a holder.
func Reload(ctx context.Context, f Files, user string) error {
	c, err := Dial(ctx, f, user, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	ok, msg, err := c.SendRequest(DoorsRequest, true, nil)
	if err != nil {
		return fmt.Errorf("asking the holder to open the doors: %w", err)
	}
	if !ok {
		if len(msg) == 0 {
			return errors.New("the holder refused to open the doors (its log says why)")
		}
		return errors.New(string(msg))
	}
	return nil
}
