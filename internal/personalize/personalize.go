// Package personalize makes a guest restored from a template's saved
// machine one VM (internal/template says when): the
// host renders a Plan from the VM's configuration (internal/cloudinit),
// and the guest's own agent-vm binary applies it as root, in one process
// (the hidden command Command, the plan as JSON on its standard input).
// It replaced a shell script that did the same with some forty processes:
// under TCG each costs 50-100 ms and python3 alone half a second, which
// was most of a clone's start.
//
// The plan holds the VM's SSH host private key: it travels over the SSH
// session only, and is written to the guest's disk where sshd reads it.
// sshd needs no signal for it: in its default re-exec mode each
// connection's sshd is a new execution that loads the host keys from
// their files (OpenSSH 9.2 of Debian 12 checked: a key file replaced under
// a running sshd is the key its next connection presents). So the
// caller's session goes on with the template's key, and its next
// connection meets the VM's.
//
// A template's restored memory also holds the SSH connections that were
// open when it was saved (its build's holder's): their peers are gone,
// but their sshd processes, logged in as the guest user, would linger
// until TCP keepalive noticed (two hours), and a new connection from the
// same host port would meet the old one's state.
// Apply ends them, every connection but the caller's (a fork's guest,
// booted from a copy of a disk, has no others to end).
package personalize

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/agent-vm/agent-vm/internal/atomicfile"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/proc"
	"github.com/agent-vm/agent-vm/internal/state"
)

// Command is the hidden agent-vm command that applies a plan in the
// guest; Binary is where the guest keeps agent-vm.
const (
	Command = "guest-personalize"
	Binary  = "/usr/local/bin/agent-vm"
)

// Plan is what makes the restored guest one VM, applied in this order.
type Plan struct {
	// Entropy is credited to the kernel's pool (RNDADDENTROPY) before the
	// CRNG is reseeded (RNDRESEEDCRNG): the guest's next random numbers,
	// the machine-id first, depend on the host's bytes, not only on the
	// template's pool (QEMU's vmgenid has reseeded it already where the
	// guest kernel has the driver).
	Entropy []byte `json:"entropy"`
	// Remove are glob patterns of files removed first (the template's
	// SSH host keys).
	Remove []string `json:"remove,omitempty"`
	Dirs   []Entry  `json:"dirs,omitempty"`
	// Files replace their paths atomically, owner and mode set first.
	Files []Entry `json:"files"`
	// Hostname goes to /etc/hostname, /etc/hosts' 127.0.1.1 line and the
	// kernel. A new /etc/machine-id (and D-Bus' copy) is always made.
	Hostname string `json:"hostname"`
	// Token is copied (mode 0600, its directory 0700): the MCP token this
	// VM's QEMU passes over fw_cfg to where agent-mcp reads it.
	Token Copy `json:"token"`
	// Restart are units restarted without waiting (journald, which takes
	// the new machine-id and boot id when it starts).
	Restart []string `json:"restart,omitempty"`
	// SSHDPidFile names the pid file of sshd's listener: each connection
	// is a child of it, and every one but the caller's (an ancestor of
	// this process) is ended (SIGTERM), being the saved machine's.
	SSHDPidFile string `json:"sshd_pid_file,omitempty"`
}

// Entry is a file or directory with its owner and mode.
type Entry struct {
	Path    string      `json:"path"`
	UID     int         `json:"uid"`
	GID     int         `json:"gid"`
	Mode    os.FileMode `json:"mode"`
	Content []byte      `json:"content,omitempty"`
}

// Copy copies a file.
type Copy struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// Kernel is what Apply asks of the guest's kernel beyond files (Linux is
// the real one).
type Kernel interface {
	AddEntropy(b []byte) error
	SetHostname(name string) error
	Signal(pid int, sig syscall.Signal) error
}

// Applier applies plans to the files under Root ("/" in the guest); Run
// runs modprobe and systemctl. Self is this process's pid (0: its own),
// whose ancestors under Root's /proc are the caller's connection.
type Applier struct {
	Root   string
	Kernel Kernel
	Run    execx.Runner
	Self   int
}

// ApplyHere is the guest's command: it applies the plan (JSON) read from
// r to this machine, as root.
func ApplyHere(ctx context.Context, r io.Reader) error {
	if os.Geteuid() != 0 {
		return errors.New(Command + " runs as root in a guest restored from a template (agent-vm start runs it)")
	}
	var p Plan
	if err := json.NewDecoder(r).Decode(&p); err != nil {
		return fmt.Errorf("reading the plan on standard input: %w", err)
	}
	return Applier{Root: "/", Kernel: Linux{}, Run: execx.OS{}}.Apply(ctx, p)
}

// Apply applies p; the first failure ends it, naming the step.
func (a Applier) Apply(ctx context.Context, p Plan) error {
	if len(p.Entropy) < 32 {
		return fmt.Errorf("the plan carries %d bytes of entropy, want at least 32", len(p.Entropy))
	}
	if p.Hostname == "" || strings.ContainsAny(p.Hostname, " \t\n/") {
		return fmt.Errorf("the plan's hostname %q is not one", p.Hostname)
	}
	if err := a.Kernel.AddEntropy(p.Entropy); err != nil {
		return fmt.Errorf("reseeding the kernel's RNG: %w", err)
	}
	for _, g := range p.Remove {
		found, err := filepath.Glob(a.path(g))
		if err != nil {
			return fmt.Errorf("removing %s: %w", g, err)
		}
		for _, f := range found {
			if err := os.Remove(f); err != nil {
				return fmt.Errorf("removing %s: %w", f, err)
			}
		}
	}
	for _, d := range p.Dirs {
		if err := a.dir(d); err != nil {
			return err
		}
	}
	for _, f := range p.Files {
		if err := atomicfile.WriteOwned(a.path(f.Path), f.Content, f.Mode, f.UID, f.GID); err != nil {
			return err
		}
	}
	if err := a.machineID(); err != nil {
		return err
	}
	if err := a.hostname(p.Hostname); err != nil {
		return err
	}
	if err := a.token(ctx, p.Token); err != nil {
		return err
	}
	for _, u := range p.Restart {
		if _, err := a.Run.Run(ctx, execx.Cmd{Path: "systemctl", Args: []string{"restart", "--no-block", u}}); err != nil {
			return fmt.Errorf("restarting %s: %w", u, err)
		}
	}
	return a.endSavedConnections(p.SSHDPidFile)
}

// endSavedConnections ends sshd's connections other than the caller's:
// the children of the listener (pidFile) that are not this process's
// ancestors. A process gone meanwhile is no error.
func (a Applier) endSavedConnections(pidFile string) error {
	if pidFile == "" {
		return nil
	}
	b, err := os.ReadFile(a.path(pidFile))
	if err != nil {
		return fmt.Errorf("ending the saved machine's SSH connections: %w", err)
	}
	listener, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || listener <= 1 {
		return fmt.Errorf("ending the saved machine's SSH connections: %s holds %q, not a pid", pidFile, strings.TrimSpace(string(b)))
	}
	parents := proc.Parents(a.path("/proc"))
	self := a.Self
	if self == 0 {
		self = os.Getpid()
	}
	mine := map[int]bool{}
	for pid := self; pid > 1 && !mine[pid]; pid = parents[pid] {
		mine[pid] = true
	}
	for pid, ppid := range parents {
		if ppid != listener || mine[pid] {
			continue
		}
		if err := a.Kernel.Signal(pid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("ending the saved machine's SSH connection (sshd pid %d): %w", pid, err)
		}
	}
	return nil
}

func (a Applier) path(p string) string { return filepath.Join(a.Root, p) }

func (a Applier) dir(d Entry) error {
	p := a.path(d.Path)
	if err := os.MkdirAll(p, d.Mode); err != nil {
		return err
	}
	if err := os.Chown(p, d.UID, d.GID); err != nil {
		return err
	}
	return os.Chmod(p, d.Mode)
}

// machineID writes a new machine-id (a random version 4 UUID, as
// `systemd-id128 new` makes one) and D-Bus' copy when it is a file of its
// own.
func (a Applier) machineID() error {
	id := []byte(strings.ReplaceAll(state.NewID(), "-", "") + "\n")
	if err := atomicfile.Write(a.path("/etc/machine-id"), id, 0o444); err != nil {
		return err
	}
	dbus := a.path("/var/lib/dbus/machine-id")
	if fi, err := os.Lstat(dbus); err == nil && fi.Mode().IsRegular() {
		return atomicfile.Write(dbus, id, 0o444)
	}
	return nil
}

// hostname sets the hostname: /etc/hostname, the 127.0.1.1 line of
// /etc/hosts (Debian's way to resolve it), the kernel's.
func (a Applier) hostname(h string) error {
	if err := atomicfile.Write(a.path("/etc/hostname"), []byte(h+"\n"), 0o644); err != nil {
		return err
	}
	hosts, err := os.ReadFile(a.path("/etc/hosts"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	var out bytes.Buffer
	for _, line := range strings.SplitAfter(string(hosts), "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == "127.0.1.1" || line == "" {
			continue
		}
		out.WriteString(line)
		if !strings.HasSuffix(line, "\n") {
			out.WriteByte('\n')
		}
	}
	fmt.Fprintf(&out, "127.0.1.1 %s\n", h)
	if err := atomicfile.Write(a.path("/etc/hosts"), out.Bytes(), 0o644); err != nil {
		return err
	}
	if err := a.Kernel.SetHostname(h); err != nil {
		return fmt.Errorf("setting the hostname: %w", err)
	}
	return nil
}

// token copies the MCP token; the fw_cfg driver is loaded first if its
// directory is missing.
func (a Applier) token(ctx context.Context, c Copy) error {
	from := a.path(c.From)
	if _, err := os.Stat(from); err != nil {
		_, _ = a.Run.Run(ctx, execx.Cmd{Path: "modprobe", Args: []string{"-q", "qemu_fw_cfg"}}) // the read below says what is missing
	}
	b, err := os.ReadFile(from)
	if err == nil && len(bytes.TrimSpace(b)) == 0 {
		err = errors.New("it is empty")
	}
	if err != nil {
		return fmt.Errorf("no MCP token in fw_cfg (%s): %w", c.From, err)
	}
	to := a.path(c.To)
	if err := os.MkdirAll(filepath.Dir(to), 0o700); err != nil {
		return err
	}
	return atomicfile.Write(to, b, 0o600)
}
