package agent

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/internal/guestconn"
	"github.com/agent-vm/agent-vm/internal/hold"
	"github.com/agent-vm/agent-vm/internal/session"
	"github.com/agent-vm/agent-vm/internal/sshx"
	"github.com/agent-vm/agent-vm/internal/termsafe"
	"golang.org/x/crypto/ssh"
)

// AttachOptions are attach's inputs.
type AttachOptions struct {
	Name    string // the branch or VM
	Session string // "" = the only session
	Term    Terminal
	Notify  func(string)
}

// Attach attaches the terminal to a session of a running VM. A session
// whose agent has ended is not attached: its scrollback is written to the
// terminal and its status returned.
func Attach(ctx context.Context, vms VMs, o AttachOptions) (*Result, error) {
	notify := o.Notify
	if notify == nil {
		notify = func(string) {}
	}
	c, slug, err := vms.Connect(ctx, o.Name)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	res := &Result{VM: slug, Branch: o.Name}
	if e, err := vms.Find(ctx, slug); err == nil && e.Record != nil {
		res.Branch = e.Record.Branch
	}
	infos, err := listSessions(ctx, c)
	if err != nil {
		return nil, err
	}
	in, err := pickSession(infos, o.Session, slug)
	if err != nil {
		return nil, err
	}
	if in.Exited {
		res.Session, res.Exited, res.Status = in.Name, true, in.Status
		if err := writeScrollback(ctx, c, in.Name, o.Term.Out); err != nil {
			return nil, err
		}
		notify(fmt.Sprintf("session %s has ended (%s); `agent-vm sessions rm %s --session %s` removes it", in.Name, ended(in), slug, in.Name))
		return res, nil
	}
	return attach(ctx, c, res, in.Name, o.Term, notify)
}

// pickSession finds the session the user means.
func pickSession(infos []session.Info, name, vmName string) (session.Info, error) {
	if name != "" {
		if in, ok := session.Find(infos, name); ok {
			return in, nil
		}
		return session.Info{}, fmt.Errorf("VM %s has no session %s%s", vmName, name, sessionHint(infos, vmName))
	}
	switch len(infos) {
	case 1:
		return infos[0], nil
	case 0:
		return session.Info{}, fmt.Errorf("VM %s has no agent sessions (hint: `agent-vm run %s` starts one)", vmName, vmName)
	}
	return session.Info{}, fmt.Errorf("VM %s has %d sessions; name one%s", vmName, len(infos), sessionHint(infos, vmName))
}

func sessionHint(infos []session.Info, vmName string) string {
	if len(infos) == 0 {
		return fmt.Sprintf(" (hint: it has none; `agent-vm run %s` starts one)", vmName)
	}
	var names []string
	for _, in := range infos {
		names = append(names, in.Name)
	}
	return fmt.Sprintf(" (hint: its sessions are %s: `agent-vm attach %s --session %s`)", strings.Join(names, ", "), vmName, names[0])
}

// attach runs the tmux client on a PTY until the user detaches or the
// agent ends (the wrapper then detaches every client), then reads how the
// session stands.
func attach(ctx context.Context, c *ssh.Client, res *Result, name string, t Terminal, notify func(string)) (*Result, error) {
	res.Session = name
	notify(fmt.Sprintf("attaching to session %s of VM %s (detach: %s; the agent runs on)", name, res.VM, session.DetachKeys))
	in := t.In
	if in == nil {
		in = os.Stdin
	}
	stop := showNotices(c, t.Err)
	_, err := sshx.Attach(ctx, c, session.Attach(name), in, t.Out, t.Err)
	stop()
	if err != nil {
		return nil, fmt.Errorf("attaching to session %s of VM %s: %w", name, res.VM, err)
	}
	// The wrapper records the status just before it detaches the clients;
	// give a session that is on its way out a moment to say so.
	var info session.Info
	for attempt := 0; ; attempt++ {
		infos, err := listSessions(ctx, c)
		if err != nil {
			return nil, err
		}
		found := false
		info, found = session.Find(infos, name)
		if !found {
			notify(fmt.Sprintf("session %s is gone (it was removed)", name))
			return res, nil
		}
		if info.Exited || attempt == 5 {
			break
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	if info.Exited {
		res.Exited, res.Status = true, info.Status
		notify(fmt.Sprintf("the agent in session %s ended (%s); `agent-vm logs %s --session %s` shows its output", name, ended(info), res.VM, name))
		return res, nil
	}
	notify(fmt.Sprintf("detached from session %s; the agent runs on (`agent-vm attach %s --session %s` re-attaches)", name, res.VM, name))
	return res, nil
}

// Sessions lists the agent sessions of a running VM.
func Sessions(ctx context.Context, vms VMs, name string) ([]session.Info, error) {
	c, _, err := vms.Connect(ctx, name)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return listSessions(ctx, c)
}

// Remove ends a session. One whose agent still runs is removed only
// with force (the agent gets SIGHUP).
func Remove(ctx context.Context, vms VMs, name, sess string, force bool) error {
	c, slug, in, err := findSession(ctx, vms, name, sess)
	if err != nil {
		return err
	}
	defer c.Close()
	if !in.Exited && !force {
		return fmt.Errorf("the agent in session %s of VM %s is still running (hint: attach and end it, `agent-vm attach %s --session %s`, or remove it anyway with --force)", sess, slug, slug, sess)
	}
	_, err = guestRun(ctx, c, session.Remove(sess), nil)
	return err
}

// Log writes a session's scrollback (escaped: it is the agent's
// output) to out.
func Log(ctx context.Context, vms VMs, name, sess string, out io.Writer) error {
	c, _, _, err := findSession(ctx, vms, name, sess)
	if err != nil {
		return err
	}
	defer c.Close()
	return writeScrollback(ctx, c, sess, out)
}

// findSession connects to a running VM and finds one of its sessions; the
// caller closes the connection.
func findSession(ctx context.Context, vms VMs, name, sess string) (*ssh.Client, string, session.Info, error) {
	c, slug, err := vms.Connect(ctx, name)
	if err != nil {
		return nil, "", session.Info{}, err
	}
	infos, err := listSessions(ctx, c)
	if err != nil {
		c.Close()
		return nil, "", session.Info{}, err
	}
	in, ok := session.Find(infos, sess)
	if !ok {
		c.Close()
		return nil, "", session.Info{}, fmt.Errorf("VM %s has no session %s%s", slug, sess, sessionHint(infos, slug))
	}
	return c, slug, in, nil
}

func writeScrollback(ctx context.Context, c *ssh.Client, sess string, out io.Writer) error {
	text, err := guestRun(ctx, c, session.Scrollback(sess), nil)
	if err != nil {
		return err
	}
	text = strings.TrimRight(text, "\n ")
	for _, line := range strings.Split(text, "\n") {
		if _, err := fmt.Fprintln(out, termsafe.Line(line)); err != nil {
			return err
		}
	}
	return nil
}

func listSessions(ctx context.Context, c *ssh.Client) ([]session.Info, error) {
	return guestconn.Sessions(ctx, c)
}

// guestRun runs a command line in the guest and returns its stdout; a
// non-zero exit is an error with its stderr.
func guestRun(ctx context.Context, c *ssh.Client, cmd string, stdin []byte) (string, error) {
	var out, errOut bytes.Buffer
	var in io.Reader
	if stdin != nil {
		in = bytes.NewReader(stdin)
	}
	code, err := sshx.Run(ctx, c, cmd, in, &out, &errOut)
	if err != nil {
		return "", err
	}
	if code != 0 {
		return "", fmt.Errorf("in the guest: exit status %d: %s", code, termsafe.String(strings.TrimSpace(errOut.String())))
	}
	return out.String(), nil
}

// showNotices writes what the VM's holder tells the user while the
// terminal is attached (a URL the guest asked the host to open, see
// hold.NoticesChannel) on w, each on a line of its own amid the session's
// raw output; stop ends it. Connected to the guest directly (no holder),
// there are none.
func showNotices(c *ssh.Client, w io.Writer) (stop func()) {
	ch, reqs, err := c.OpenChannel(hold.NoticesChannel, nil)
	if err != nil {
		return func() {}
	}
	go ssh.DiscardRequests(reqs)
	go func() {
		sc := bufio.NewScanner(ch)
		for sc.Scan() {
			// The holder's lines are its own, the guest's text in them
			// escaped already; in raw mode a line ends with CR LF.
			fmt.Fprintf(w, "\r\n%s\r\n", sc.Text())
		}
	}()
	return func() { ch.Close() }
}
