// Package tcpfwd carries TCP connections from listeners on this host's
// loopback to another address: the SSH, MCP and exposed-port forwards of a
// VM whose guest has an address of its own on a libvirt network (the
// libvirt driver's), where no QEMU user-network forward exists. agent-vm
// runs it as the hidden `net-forward` command, one process per running VM,
// started with the VM and ended with it. A VM on another libvirt host is
// reached through agent-vm's SSH link to that host (hostlink.Tunnel, the
// Dialer `net-forward --via-addr` serves with), so its guest's address
// need not be reachable from here.
//
// Nothing listens beyond 127.0.0.1: the host's other machines never reach
// a guest through it, as they never reach the QEMU driver's forwards. All
// of a VM's listeners open or none does (Listen), so a port another
// program holds fails the start with its number, not a guest reached
// through someone else's listener.
package tcpfwd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"
)

// Rule forwards 127.0.0.1:Port to To (host:port).
type Rule struct {
	Port int
	To   string
}

// ParseRule reads "PORT=HOST:PORT", the form `net-forward --forward` takes.
func ParseRule(s string) (Rule, error) {
	p, to, ok := cutEq(s)
	port, err := strconv.Atoi(p)
	if !ok || err != nil || port <= 0 || port > 65535 {
		return Rule{}, fmt.Errorf("forward %q is not PORT=HOST:PORT", s)
	}
	if _, tp, err := net.SplitHostPort(to); err != nil || tp == "" {
		return Rule{}, fmt.Errorf("forward %q is not PORT=HOST:PORT", s)
	}
	return Rule{Port: port, To: to}, nil
}

func cutEq(s string) (string, string, bool) {
	for i := range len(s) {
		if s[i] == '=' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

// String is r in ParseRule's form.
func (r Rule) String() string { return strconv.Itoa(r.Port) + "=" + r.To }

// Forwarder is a VM's listeners, open.
type Forwarder struct {
	rules []Rule
	ls    []net.Listener
}

// Listen opens 127.0.0.1:Port for every rule, or none: a port that cannot
// be bound is an error naming it.
func Listen(rules []Rule) (*Forwarder, error) {
	f := &Forwarder{rules: rules}
	for _, r := range rules {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(r.Port)))
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("listening on 127.0.0.1:%d for the forward to %s: %w (hint: another program holds the port; `ss -ltnp 'sport = :%d'` names it)", r.Port, r.To, err, r.Port)
		}
		f.ls = append(f.ls, l)
	}
	return f, nil
}

// ListeningLine is the line net-forward prints once it listens on port,
// for the driver that waits for it: another program on the port answers
// a probe too, and would be taken for the forward.
func ListeningLine(port int) string { return "listening on 127.0.0.1:" + strconv.Itoa(port) }

// Close closes the listeners; connections being carried go on until Serve's
// ctx ends.
func (f *Forwarder) Close() {
	for _, l := range f.ls {
		l.Close()
	}
}

// Dialer opens the connection a forward carries to; nil is a plain TCP
// dial from this host.
type Dialer func(ctx context.Context, addr string) (net.Conn, error)

// DialTimeout bounds a connection to the destination: a guest that does
// not answer fails the client's connection rather than holding it.
const DialTimeout = 10 * time.Second

// Serve carries each accepted connection to its rule's destination until
// ctx ends, then closes the listeners and every connection it carries.
func (f *Forwarder) Serve(ctx context.Context, dial Dialer) error {
	if dial == nil {
		var d net.Dialer
		dial = func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, len(f.ls))
	for i, l := range f.ls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- f.accept(ctx, l, f.rules[i].To, dial, &wg)
		}()
	}
	stop := context.AfterFunc(ctx, f.Close)
	defer stop()
	var err error
	select {
	case <-ctx.Done():
	case err = <-errs:
		cancel()
	}
	wg.Wait()
	return err
}

func (f *Forwarder) accept(ctx context.Context, l net.Listener, to string, dial Dialer, wg *sync.WaitGroup) error {
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("accepting on %s: %w", l.Addr(), err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			dctx, cancel := context.WithTimeout(ctx, DialTimeout)
			up, err := dial(dctx, to)
			cancel()
			if err != nil {
				return // the client sees its connection closed
			}
			defer up.Close()
			stop := context.AfterFunc(ctx, func() { c.Close(); up.Close() })
			defer stop()
			Splice(c, up)
		}()
	}
}

// Splice copies a to b and b to a until both directions end, passing each
// end's EOF on as a half close where the connection has one.
func Splice(a, b net.Conn) {
	var wg sync.WaitGroup
	wg.Add(2)
	one := func(dst, src net.Conn) {
		defer wg.Done()
		_, _ = io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		} else {
			dst.Close()
		}
	}
	go one(a, b)
	go one(b, a)
	wg.Wait()
}
