// Package virtiofsd runs the workspace share's host side for the drivers
// that attach it over virtiofs (the QEMU driver, internal/qemu, and the
// vagrant driver, internal/vagrant): finding the virtiofsd binary (QEMU's
// C one or the Rust one), its command line for a share, starting it, as
// root in agent-vm's jail (package sharejail), and waiting for its socket,
// and stopping it, or a stray one, by the socket it serves. Where the
// socket lives and who connects to it are the driver's.
package virtiofsd

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/proc"
	"github.com/agent-vm/agent-vm/internal/sharejail"
)

// Files of a share, as the drivers name them: the socket QEMU connects to
// and virtiofsd's output.
const (
	SocketFile = "virtiofsd.sock"
	LogFile    = "virtiofsd.log"
)

// places are where distributions install virtiofsd besides PATH:
// Debian/Ubuntu's QEMU ships the C one in /usr/lib/qemu, Fedora and others
// put the Rust one in /usr/libexec.
func places() []string {
	return []string{"/usr/libexec/virtiofsd", "/usr/lib/qemu/virtiofsd", "/usr/lib/virtiofsd"}
}

// Binary is a found virtiofsd binary.
type Binary struct {
	Path string
	Rust bool // the Rust implementation (different flags from QEMU's C one)
}

// Find looks for virtiofsd on PATH and in the usual places.
func Find(ctx context.Context, run execx.Runner) (*Binary, error) {
	return find(ctx, run, places())
}

func find(ctx context.Context, run execx.Runner, places []string) (*Binary, error) {
	cands := places
	if p, err := run.LookPath("virtiofsd"); err == nil {
		cands = append([]string{p}, cands...)
	}
	for _, p := range cands {
		fi, err := os.Stat(p)
		if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			continue
		}
		res, err := run.Run(ctx, execx.Cmd{Path: p, Args: []string{"--help"}})
		help := string(res.Stdout) + string(res.Stderr)
		if err != nil && help == "" {
			continue
		}
		return &Binary{Path: p, Rust: strings.Contains(help, "--shared-dir")}, nil
	}
	return nil, fmt.Errorf("virtiofsd not found on PATH or in %s (hint: install it: Debian 12's package qemu-system-common has it, newer Debian/Ubuntu and Fedora package it as virtiofsd; without it the workspace is shared over 9p, which is slower for many small files)", strings.Join(places, ", "))
}

// cacheOption is the cache mode in this virtiofsd's words: the Rust one
// calls none "never".
func (b *Binary) cacheOption(mode string) string {
	if b.Rust && mode == driver.ShareCacheNone {
		return "never"
	}
	return mode
}

// args is virtiofsd's command line for sharing s on sock.
func (b *Binary) args(s driver.Share, sock string) []string {
	cache := b.cacheOption(s.CacheMode())
	if b.Rust {
		args := []string{"--socket-path", sock, "--shared-dir", s.Source, "--cache", cache}
		if os.Geteuid() != 0 {
			// Unprivileged: no namespace sandbox; the process's own uid
			// owns what the guest writes.
			args = append(args, "--sandbox", "none")
		}
		return args
	}
	return []string{"--socket-path=" + sock, "-o", "source=" + s.Source, "-o", "cache=" + cache}
}

// Spec is one virtiofsd: the share it serves on Socket, its output to
// Log.
type Spec struct {
	Share  driver.Share
	Socket string
	Log    string
}

// Jailed reports whether b serving s runs in agent-vm's jail (package
// sharejail) when agent-vm's effective uid is euid: as root, QEMU's C
// virtiofsd for a share whose owner is known. Unjailed as root (the Rust
// one, or an unknown owner), what the guest's root does in the share is
// done as root on the host.
func (b *Binary) Jailed(euid int, s driver.Share) bool {
	return !b.Rust && euid == 0 && s.UID > 0 && s.GID > 0
}

// Options are where a start looks at its own process; the zero value is
// the real ones.
type Options struct {
	// Geteuid is the user agent-vm runs as; nil = os.Geteuid.
	Geteuid func() int
	// Self is the agent-vm binary, which runs the jail; nil =
	// os.Executable.
	Self func() (string, error)
}

func (o Options) euid() int {
	if o.Geteuid != nil {
		return o.Geteuid()
	}
	return os.Geteuid()
}

// Process is how virtiofsd runs for s. As root, QEMU's C virtiofsd runs
// in agent-vm's jail (package sharejail) as the workspace's owner, so what
// the guest's root does in the workspace cannot make setuid, root-owned or
// special files on the host.
func Process(b *Binary, s Spec, o Options) (execx.Detached, error) {
	d := execx.Detached{Path: b.Path, Args: b.args(s.Share, s.Socket), StdoutPath: s.Log}
	if !b.Jailed(o.euid(), s.Share) {
		return d, nil
	}
	self := o.Self
	if self == nil {
		self = os.Executable
	}
	exe, err := self()
	if err != nil {
		return d, fmt.Errorf("finding agent-vm's own binary for the virtiofsd jail: %w", err)
	}
	spec := sharejail.Spec{UID: s.Share.UID, GID: s.Share.GID, Source: s.Share.Source, SocketPath: s.Socket,
		Virtiofsd: b.Path, Options: []string{"-o", "cache=" + b.cacheOption(s.Share.CacheMode())}}
	d.Path, d.Args = exe, spec.Args()
	return d, nil
}

// Start starts b serving s (jailed as root, see Jailed) and waits until
// its socket listens (Listening). It returns virtiofsd's pid (the jail's, as root); on failure
// the process is gone and the error says why.
func Start(ctx context.Context, run execx.Runner, b *Binary, s Spec, o Options) (int, error) {
	sock := s.Socket
	_ = os.Remove(sock)
	d, err := Process(b, s, o)
	if err != nil {
		return 0, err
	}
	p, err := run.Start(d)
	if err != nil {
		return 0, fmt.Errorf("starting virtiofsd: %w", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, 200*time.Millisecond) {
		if Listening(sock) {
			return p.Pid(), nil
		}
		select {
		case <-p.Exited():
			return 0, fmt.Errorf("virtiofsd exited at once (code %d): %s", p.ExitCode(), driver.TailFile(s.Log, 3))
		case <-ctx.Done():
			proc.Kill(p.Pid(), Serving(sock))
			return 0, ctx.Err()
		case <-time.After(wait):
		}
		if time.Now().After(deadline) {
			proc.Kill(p.Pid(), Serving(sock))
			return 0, fmt.Errorf("virtiofsd did not create its socket %s within 10s: %s", sock, driver.TailFile(s.Log, 3))
		}
	}
}

// Listening reports whether a unix socket bound at path listens, as the
// kernel's table of unix sockets says (the __SO_ACCEPTCON flag), without
// connecting: a connection would be virtiofsd's one vhost-user client, and
// it exits when its client goes. The socket file appears at bind(2), a
// moment before listen(2); QEMU connecting in between is refused and
// fails to start (seen under load). Where that table cannot be read it
// falls back to the file being there.
func Listening(path string) bool {
	b, err := os.ReadFile("/proc/net/unix")
	if err != nil {
		_, err := os.Stat(path)
		return err == nil
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := unixSocketLine.FindStringSubmatch(line)
		if f == nil || f[2] != path {
			continue
		}
		if flags, err := strconv.ParseUint(f[1], 16, 32); err == nil && flags&soAcceptCon != 0 {
			return true
		}
	}
	return false
}

// unixSocketLine is a line of /proc/net/unix: "Num: RefCount Protocol
// Flags Type St Inode Path", the path being all after the inode's space.
var unixSocketLine = regexp.MustCompile(`^\s*[0-9a-fA-F]+: [0-9a-fA-F]+ [0-9a-fA-F]+ ([0-9a-fA-F]+) [0-9a-fA-F]+ [0-9a-fA-F]+\s+[0-9]+ (.+)$`)

// soAcceptCon is __SO_ACCEPTCON, a listening socket's flag there.
const soAcceptCon = 1 << 16

// Serving matches a virtiofsd serving this socket (its own command line
// or the jail's).
func Serving(sock string) proc.Match {
	return func(args []string) bool {
		for i, a := range args {
			if a == "--socket-path="+sock || (a == "--socket-path" && i+1 < len(args) && args[i+1] == sock) {
				return true
			}
		}
		return false
	}
}

// Kill kills the virtiofsd serving socket at once: pid if it is that
// process, else whichever process is. It reports whether one was killed.
func Kill(pid int, socket string) bool {
	match := Serving(socket)
	if !proc.Verified(pid, match) {
		pid = proc.Find(match)
	}
	return pid > 0 && proc.Kill(pid, match)
}

// Stop ends the virtiofsd pid serving socket (0: none): it exits by
// itself when QEMU goes, so it is given wait to; then SIGTERM, then
// SIGKILL.
func Stop(pid int, socket string, wait time.Duration) {
	if pid == 0 {
		return
	}
	match := Serving(socket)
	if !proc.WaitGone(pid, match, wait) {
		end(pid, match)
	}
	// The namespace sandbox's child serves the same socket and ends when
	// its parent does (a parent-death signal), unhurried on a busy host:
	// it is waited for too, and ended if it lingers.
	for _, child := range proc.FindAll(match) {
		if !proc.WaitGone(child, match, 2*time.Second) {
			end(child, match)
		}
	}
}

// end stops one process: SIGTERM, then SIGKILL after 2 s, and waits until
// it is gone.
func end(pid int, match proc.Match) {
	proc.Signal(pid, match, syscall.SIGTERM)
	if !proc.WaitGone(pid, match, 2*time.Second) {
		proc.Kill(pid, match)
		proc.WaitGone(pid, match, 2*time.Second)
	}
}

// StopStrays ends every virtiofsd still serving socket: one a start
// killed before it recorded it left, or two at once (one still exiting
// when another was started for the same socket), which proc.Find alone
// would pick one of.
func StopStrays(socket string) {
	for _, pid := range proc.FindAll(Serving(socket)) {
		Stop(pid, socket, 0)
	}
}
