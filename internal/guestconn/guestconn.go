// Package guestconn reaches a VM's guest over SSH: through the VM's
// holder when one serves (internal/hold: one held connection the commands
// share, a local handshake each), else directly with the VM's client key
// and pinned host key. It starts, waits for, stops and serves the holder
// (the hidden __hold command), and runs scripts as root in the guest.
//
// It knows the VM only as its record and directory (internal/state); a
// guest the user configured (a foreign guest, which has no pinned host
// key) is the caller's to refuse.
package guestconn

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/crypto/ssh"

	"github.com/agent-vm/agent-vm/internal/autocheckpoint"
	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/hold"
	"github.com/agent-vm/agent-vm/internal/idle"
	"github.com/agent-vm/agent-vm/internal/notify"
	"github.com/agent-vm/agent-vm/internal/proc"
	"github.com/agent-vm/agent-vm/internal/qemu"
	"github.com/agent-vm/agent-vm/internal/session"
	"github.com/agent-vm/agent-vm/internal/sshx"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/termsafe"
	"github.com/agent-vm/agent-vm/internal/userconfig"
)

// Guest is one VM's guest as agent-vm reaches it.
type Guest struct {
	Record *state.Record
	Layout state.Layout
	Log    hclog.Logger
}

// Target is the VM's SSH endpoint, with its pinned host key.
func (g Guest) Target() sshx.Target {
	r, l := g.Record, g.Layout
	return sshx.Target{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(r.Ports.SSH)), User: r.Guest.User,
		KeyFile: l.ClientKey(), KnownHosts: l.KnownHosts()}
}

// Files are the files of the VM's holder; its command line names the VM
// directory (marker), which is how stop knows it.
func (g Guest) Files() hold.Files { return hold.FilesFor(g.Layout.RunDir(), g.Record.ID) }

func (g Guest) marker() string { return g.Layout.Dir }

// Dial connects to the guest: through the VM's holder when one serves,
// else directly with the pinned host key. A guest that is up can still
// drop a connection now and then (sshd restarting, a busy TCG guest): a
// reset or refused direct connection is tried again for a few seconds; a
// host key mismatch never is.
func (g Guest) Dial(ctx context.Context) (*ssh.Client, error) {
	c, err := g.DialHeld(ctx)
	if err == nil {
		return c, nil
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return g.DialDirect(ctx, err)
}

// DialHeld connects through the VM's holder (hold.ErrNoHolder when none
// serves).
func (g Guest) DialHeld(ctx context.Context) (*ssh.Client, error) {
	return hold.Dial(ctx, g.Files(), g.Record.Guest.User, 5*time.Second)
}

// DialDirect connects to the guest itself (Dial's fallback; why says why
// the holder did not serve).
func (g Guest) DialDirect(ctx context.Context, why error) (*ssh.Client, error) {
	g.Log.Debug("no held connection, dialing the guest directly", "reason", why)
	target := g.Target()
	var c *ssh.Client
	var err error
	for attempt, delay := 0, 500*time.Millisecond; ; attempt, delay = attempt+1, delay*2 {
		c, err = sshx.Dial(ctx, target, 15*time.Second)
		if err == nil || errors.Is(err, sshx.ErrHostKeyMismatch) || ctx.Err() != nil || attempt == 3 {
			return c, err
		}
		g.Log.Debug("ssh connection failed, trying again", "error", err)
		select {
		case <-ctx.Done():
		case <-time.After(delay):
		}
	}
}

// Root runs a shell script as root in the guest (its user has
// passwordless sudo); script is called once connected.
func (g Guest) Root(ctx context.Context, script func() string) (code int, stdout, stderr string, err error) {
	c, err := g.Dial(ctx)
	if err != nil {
		return -1, "", "", err
	}
	defer c.Close()
	return RootOn(c)(ctx, script)
}

// RootOn runs shell scripts as root on the open connection c, as Root does
// on a connection of its own (guestctl's Root).
func RootOn(c *ssh.Client) func(ctx context.Context, script func() string) (code int, stdout, stderr string, err error) {
	return func(ctx context.Context, script func() string) (int, string, string, error) {
		var out, errOut bytes.Buffer
		code, err := sshx.Run(ctx, c, guest.RootShell, strings.NewReader(script()), &out, &errOut)
		return code, out.String(), errOut.String(), err
	}
}

// StartHolder starts the VM's holder, detached, unless one runs: the
// agent-vm binary self names, run by run. Failing to is a warning:
// commands dial the guest directly then.
func (g Guest) StartHolder(run execx.Runner, self func() (string, error)) {
	if err := hold.Launch(run, self, g.Files(), g.marker(), g.Layout.Log(hold.LogName)); err != nil {
		g.Log.Warn("not holding a connection to the guest; commands connect to it directly, each with a full SSH handshake", "error", err)
	}
}

// WaitHolder waits, up to limit, until the VM's holder serves its socket
// (it does once its own connection to the guest is up). Not serving by
// then is no error: commands dial the guest directly.
func (g Guest) WaitHolder(ctx context.Context, limit time.Duration) {
	if !hold.Wait(ctx, g.Files(), g.marker(), limit) {
		g.Log.Debug("the holder does not serve; commands dial the guest directly", "log", g.Layout.Log(hold.LogName))
	}
}

// StopHolder ends the VM's holder. It would end by itself once the VM's
// QEMU is gone; stop does not leave that to chance.
func (g Guest) StopHolder(ctx context.Context) {
	if g.Record == nil || g.Record.ID == "" {
		return
	}
	if err := hold.Stop(ctx, g.Files(), g.marker(), 5*time.Second); err != nil {
		g.Log.Warn("could not end the VM's holder", "error", err)
	}
}

// Held is the holder's socket when a holder of the VM runs, else "".
func (g Guest) Held() string {
	if g.Record.ID == "" {
		return ""
	}
	return hold.Socket(g.Files(), g.marker())
}

// ServeDir runs the holder of the VM whose directory is dir until ctx
// ends or its connection to the guest does (the hidden __hold command,
// which start runs with the VM's directory). A guest made from the user's
// own configuration (the record's Guest.Foreign) has no pinned host key to
// hold a connection with.
func ServeDir(ctx context.Context, dir string, log hclog.Logger) error {
	l := state.Layout{Dir: dir}
	r, err := state.ReadRecord(l.Record())
	if err != nil {
		return fmt.Errorf("reading the VM of %s: %w (hint: `agent-vm start` runs the holder itself, with the VM's directory)", dir, err)
	}
	if r.Guest.Foreign != "" {
		return fmt.Errorf("VM %q runs %s as is, so it has no pinned host key to hold a connection with", r.Branch, r.Guest.Foreign)
	}
	return Guest{Record: r, Layout: l, Log: log}.Serve(ctx)
}

// Serve runs the VM's holder until ctx ends or its connection to the
// guest does (the hidden __hold command).
func (g Guest) Serve(ctx context.Context) error {
	target := g.Target()
	h := &hold.Holder{Files: g.Files(), RunDir: g.Layout.RunDir(), Log: g.Log.With("vm", g.Record.Slug),
		Dial: func(ctx context.Context) (*ssh.Client, error) { return sshx.Dial(ctx, target, 30*time.Second) }}
	h.Notices = hold.NewNotices()
	h.ReverseForwards = func() ([]hold.ReverseForward, error) { return g.reverseForwards(h.Log, h.Notices) }
	h.Asleep = func() bool { return qemu.Hibernated(g.Layout.RunDir()) }
	h.Watch = g.watch(h)
	// run --on-wait's command is the VM's until it stops, which ends this.
	defer os.Remove(filepath.Join(g.Layout.RunDir(), notify.OnWaitFile))
	return h.Run(ctx)
}

// watch is the holder's watch of the VM over its held connection c: the
// user is told when an agent starts waiting (internal/notify), the VM
// hibernates when idle for the user's idle_suspend (internal/idle), and
// checkpoints are taken as its agent works when its record says so
// (internal/autocheckpoint).
func (g Guest) watch(h *hold.Holder) func(ctx context.Context, c *ssh.Client) {
	config := func() *userconfig.Config {
		c, err := userconfig.Load(userconfig.Path(os.Getenv))
		if err != nil {
			h.Log.Debug("reading the user's config", "error", err)
			return &userconfig.Config{}
		}
		return c
	}
	return func(ctx context.Context, c *ssh.Client) {
		list := func(ctx context.Context) ([]session.Info, error) {
			if h.Asleep() { // asking would wait for the guest to run again
				return nil, errors.New("the VM is hibernated")
			}
			return Sessions(ctx, c)
		}
		w := &notify.Watcher{Branch: g.Record.Branch, VM: g.Record.Slug, Run: execx.OS{}, Getenv: os.Getenv, Log: h.Log.Named("notify"), List: list,
			Asks: func() ([]egress.Ask, error) { return egress.ReadAsks(g.Layout.NetDir()) },
			OnWait: func() (string, error) {
				return notify.OnWait(g.Layout.RunDir(), func() (string, error) { return config().OnWait, nil })
			}}
		record := state.Follow(g.Layout, g.Record)
		// The repository's idle_suspend (checked at create) wins over the user's.
		repo, _ := userconfig.ParseIdle(g.Record.IdleSuspend)
		go g.idleWatch(h, list, record, func() time.Duration { return cmp.Or(repo, config().IdleAfter) }).Run(ctx)
		go (&autocheckpoint.Watch{Schedule: func() *state.AutoCheckpoint { return record().AutoCheckpoint }, Sessions: list, Asleep: h.Asleep,
			Log: h.Log.Named("checkpoint"),
			Take: func(ctx context.Context) error {
				return g.agentVM(ctx, autocheckpoint.LogName, "--state-dir", filepath.Dir(g.Layout.Dir), "checkpoint", "--auto", "--vm", g.Record.Slug)
			}}).Run(ctx)
		w.Watch(ctx)
	}
}

// agentVM runs agent-vm with args, detached (what it does must not end
// with the holder), its output in the VM's log of that name, and waits for
// it.
func (g Guest) agentVM(ctx context.Context, log string, args ...string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	p, err := execx.OS{}.Start(execx.Detached{Path: exe, Args: args, Dir: "/", StdoutPath: g.Layout.Log(log)})
	if err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return nil
	case <-p.Exited():
	}
	if p.ExitCode() != 0 {
		return fmt.Errorf("agent-vm %s: exit status %d (see %s)", strings.Join(args, " "), p.ExitCode(), g.Layout.Log(log))
	}
	return nil
}

// idleWatch is the VM's idle.Watch: its CPU is its QEMU's (the QEMU
// driver's pid file; a VM of another driver never hibernates), its ports
// those of its record as it is now, its commands agent-vm's.
func (g Guest) idleWatch(h *hold.Holder, list func(context.Context) ([]session.Info, error), record func() *state.Record, after func() time.Duration) *idle.Watch {
	command := func(ctx context.Context, verb ...string) error {
		return g.agentVM(ctx, idle.SuspendLog, idle.Args(g.Layout, verb...)...)
	}
	return &idle.Watch{After: after, Ports: func() []int { return idle.Ports(record()) }, Sessions: list, Log: h.Log.Named("idle"),
		Held: func() (int, []string) { return h.InUse(idle.Every / 3) }, Asleep: h.Asleep,
		CPU: func() (time.Duration, error) {
			pid, err := proc.ReadPid(g.Layout.Run(qemu.PidFile))
			if err != nil {
				return 0, err
			}
			return proc.CPUTime(pid)
		},
		Hibernate: func(ctx context.Context) error { return command(ctx, "suspend", "--hibernate") },
		Wake: func(ctx context.Context) error {
			// The connection that asked waits on: tell the user, who can act.
			err := command(ctx, "resume")
			if err != nil && !h.Asleep() {
				err = nil // woken meanwhile by a command that uses it (vm.Connect)
			}
			if err != nil {
				notify.Desktop(ctx, execx.OS{}, os.Getenv, h.Log, "agent-vm: "+termsafe.String(g.Record.Branch)+" did not wake",
					fmt.Sprintf("A connection to it waits. `agent-vm resume %s` says why (%s).", g.Record.Slug, g.Layout.Log(idle.SuspendLog)))
			}
			return err
		}}
}

// Sessions lists the agent sessions of the guest c is connected to, as
// they are now (session.List, read by session.Parse).
func Sessions(ctx context.Context, c *ssh.Client) ([]session.Info, error) {
	var out, errOut bytes.Buffer
	code, err := sshx.Run(ctx, c, session.List(), nil, &out, &errOut)
	if err != nil {
		return nil, err
	}
	if code != 0 {
		return nil, fmt.Errorf("in the guest: exit status %d: %s", code, termsafe.String(strings.TrimSpace(errOut.String())))
	}
	return session.Parse(out.String(), time.Now())
}
