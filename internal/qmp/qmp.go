// Package qmp is a minimal client for QEMU's machine protocol over a unix
// socket: the greeting, capability negotiation, commands with ids, and events
// skipped (but kept for callers that wait for one). Replies are read with
// gjson rather than decoded into structs, since each command has its own shape.
package qmp

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/tidwall/gjson"
)

// Client is one QMP connection. QEMU serves one client per socket at a time,
// so callers keep connections short.
type Client struct {
	conn    net.Conn
	r       *bufio.Reader
	mu      sync.Mutex
	nextID  int
	Version string // QEMU version from the greeting, e.g. "7.2.22"
	events  []gjson.Result
	// oob is the SCM_RIGHTS message the next command carries (SendFD).
	oob []byte
	uc  *net.UnixConn
}

// Error is an error reply from QEMU.
type Error struct {
	Command string
	Class   string
	Desc    string
}

func (e *Error) Error() string { return fmt.Sprintf("qmp %s: %s: %s", e.Command, e.Class, e.Desc) }

// maxLine bounds a QMP message; replies such as query-qmp-schema are large.
const maxLine = 16 << 20

// Dial connects to the QMP socket at path, reads the greeting and enters
// command mode. ctx bounds the whole handshake.
func Dial(ctx context.Context, path string) (*Client, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("connecting to QMP socket %s: %w", path, err)
	}
	c := &Client{conn: conn, r: bufio.NewReaderSize(conn, 64<<10)}
	if err := c.handshake(ctx); err != nil {
		conn.Close()
		return nil, fmt.Errorf("QMP handshake on %s: %w", path, err)
	}
	return c, nil
}

func (c *Client) handshake(ctx context.Context) error {
	stop := c.deadline(ctx)
	defer stop()
	line, err := c.readLine()
	if err != nil {
		return err
	}
	g := gjson.ParseBytes(line)
	if !g.Get("QMP").Exists() {
		return fmt.Errorf("unexpected greeting %.200s", line)
	}
	v := g.Get("QMP.version.qemu")
	c.Version = fmt.Sprintf("%d.%d.%d", v.Get("major").Int(), v.Get("minor").Int(), v.Get("micro").Int())
	_, err = c.execute("qmp_capabilities", nil)
	return err
}

// Execute runs a command and returns its "return" value. Events that arrive
// meanwhile are kept (see Events).
func (c *Client) Execute(ctx context.Context, command string, args any) (gjson.Result, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	stop := c.deadline(ctx)
	defer stop()
	res, err := c.execute(command, args)
	if cerr := ctxErr(ctx, err); cerr != nil {
		return gjson.Result{}, fmt.Errorf("qmp %s: %w", command, cerr)
	}
	return res, err
}

// SendFD hands QEMU a file descriptor under name (QMP getfd: the
// descriptor travels as SCM_RIGHTS with the command), for commands that
// take "fd:NAME" (migrate, migrate-incoming) or an fd socket address
// (chardev-add). QEMU keeps its own copy; the caller closes f.
func (c *Client) SendFD(ctx context.Context, name string, f *os.File) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	stop := c.deadline(ctx)
	defer stop()
	uc, ok := c.conn.(*net.UnixConn)
	if !ok {
		return errors.New("qmp getfd: descriptors pass only over a unix socket")
	}
	c.oob = syscall.UnixRights(int(f.Fd()))
	c.uc = uc
	_, err := c.execute("getfd", map[string]string{"fdname": name})
	if cerr := ctxErr(ctx, err); cerr != nil {
		return fmt.Errorf("qmp getfd: %w", cerr)
	}
	return err
}

func (c *Client) execute(command string, args any) (gjson.Result, error) {
	c.nextID++
	id := c.nextID
	req := map[string]any{"execute": command, "id": id}
	if args != nil {
		req["arguments"] = args
	}
	b, err := json.Marshal(req)
	if err != nil {
		return gjson.Result{}, err
	}
	if err := c.write(append(b, '\n')); err != nil {
		return gjson.Result{}, fmt.Errorf("qmp %s: %w", command, err)
	}
	for {
		line, err := c.readLine()
		if err != nil {
			return gjson.Result{}, fmt.Errorf("qmp %s: %w", command, err)
		}
		msg := gjson.ParseBytes(line)
		if msg.Get("event").Exists() {
			c.events = append(c.events, msg)
			continue
		}
		if msg.Get("id").Int() != int64(id) {
			continue // a reply to a command we gave up on
		}
		if e := msg.Get("error"); e.Exists() {
			return gjson.Result{}, &Error{Command: command, Class: e.Get("class").String(), Desc: e.Get("desc").String()}
		}
		return msg.Get("return"), nil
	}
}

// write sends one command, with the descriptor SendFD set up, if any.
func (c *Client) write(b []byte) error {
	if c.oob == nil {
		_, err := c.conn.Write(b)
		return err
	}
	oob := c.oob
	c.oob = nil
	n, oobn, err := c.uc.WriteMsgUnix(b, oob, nil)
	if err == nil && (n != len(b) || oobn != len(oob)) {
		err = io.ErrShortWrite
	}
	return err
}

// WaitEvent reads until an event with this name arrives or ctx ends.
func (c *Client) WaitEvent(ctx context.Context, name string) (gjson.Result, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, e := range c.events {
		if e.Get("event").String() == name {
			c.events = append(c.events[:i], c.events[i+1:]...)
			return e, nil
		}
	}
	stop := c.deadline(ctx)
	defer stop()
	for {
		line, err := c.readLine()
		if err != nil {
			if cerr := ctxErr(ctx, err); cerr != nil {
				err = cerr
			}
			return gjson.Result{}, fmt.Errorf("waiting for QMP event %s: %w", name, err)
		}
		msg := gjson.ParseBytes(line)
		if msg.Get("event").String() == name {
			return msg, nil
		}
		if msg.Get("event").Exists() {
			c.events = append(c.events, msg)
		}
	}
}

// Close ends the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Status is query-status's answer: "running", "paused", "shutdown", ...
func (c *Client) Status(ctx context.Context) (string, error) {
	r, err := c.Execute(ctx, "query-status", nil)
	if err != nil {
		return "", err
	}
	return r.Get("status").String(), nil
}

func (c *Client) readLine() ([]byte, error) {
	var buf []byte
	for {
		chunk, isPrefix, err := c.r.ReadLine()
		if err != nil {
			return nil, err
		}
		buf = append(buf, chunk...)
		if len(buf) > maxLine {
			return nil, errors.New("QMP message too large")
		}
		if !isPrefix {
			return buf, nil
		}
	}
}

// deadline applies ctx's deadline to the connection and makes cancellation
// interrupt a blocked read. The returned func undoes both.
func (c *Client) deadline(ctx context.Context) func() {
	if dl, ok := ctx.Deadline(); ok {
		_ = c.conn.SetDeadline(dl)
	}
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		select {
		case <-ctx.Done():
			_ = c.conn.SetDeadline(time.Now())
		case <-done:
		}
	}()
	return func() {
		// Wait for the goroutine: if ctx ends just after (a caller that
		// cancels its dial context and keeps the client), it must not
		// set a deadline on the next command.
		close(done)
		<-exited
		_ = c.conn.SetDeadline(time.Time{})
	}
}

// ctxErr returns ctx's error when err is a read timeout caused by ctx (its
// deadline, applied to the connection, can fire a moment before ctx is done).
func ctxErr(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
			return context.DeadlineExceeded
		}
	}
	return nil
}
