// Package sharejail runs QEMU's C virtiofsd so that the workspace share is
// not a way out of the guest, when agent-vm runs as root.
//
// virtiofsd creates a file with the guest caller's uid and does chmod and
// chown with its own privileges, so run as root it lets a guest with sudo
// make setuid-root programs, root-owned files and device nodes on the host.
// It has no uid translation and no option that refuses those. So the jail:
//
//   - runs virtiofsd as the workspace's owner, in a user namespace that maps
//     that one uid and gid to themselves: a request from the guest's root
//     (uid 0, unmapped) to create or chown fails with EINVAL, and no device
//     node can be made from a user namespace. virtiofsd keeps the
//     capabilities it needs, but only inside that namespace, so they apply
//     only to files the owner owns;
//   - installs a seccomp filter that virtiofsd inherits: chmod, open, mkdir
//     and mknod with a setuid or setgid bit fail with EPERM, mknod of
//     anything but a regular file (FIFOs, sockets, devices) fails with
//     EPERM, and no extended attribute can be set (so no file capabilities);
//   - reaches the workspace through a bind mount in a private mount
//     namespace, made as root before dropping, so the owner need not be
//     able to walk the workspace's parent directories (a state directory in
//     /root), and hands virtiofsd its socket already listening.
//
// The jail is agent-vm itself, run as `agent-vm __virtiofsd-jail ...`
// (Command), which execs virtiofsd as its child and waits for it.
package sharejail

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// Command is the hidden agent-vm command that runs the jail.
const Command = "__virtiofsd-jail"

// mountPoint is where the workspace appears in the jail's mount namespace:
// a directory every user can walk to. Over it, nothing else of /tmp is
// visible to virtiofsd.
const mountPoint = "/tmp"

// Spec is one jailed virtiofsd.
type Spec struct {
	UID, GID   int
	Source     string   // the shared directory
	SocketPath string   // the vhost-user socket QEMU connects to
	Virtiofsd  string   // QEMU's C virtiofsd
	Options    []string // more virtiofsd arguments (e.g. -o cache=auto)
}

// Args is the jail's command line after the agent-vm binary. It carries
// --socket-path=SOCK, by which the launcher knows the process as this VM's
// virtiofsd.
func (s Spec) Args() []string {
	args := []string{Command, "--uid=" + strconv.Itoa(s.UID), "--gid=" + strconv.Itoa(s.GID),
		"--source=" + s.Source, "--socket-path=" + s.SocketPath, "--", s.Virtiofsd}
	return append(args, s.Options...)
}

// parse reads Args back.
func parse(args []string) (Spec, error) {
	var s Spec
	fs := flag.NewFlagSet(Command, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.IntVar(&s.UID, "uid", 0, "")
	fs.IntVar(&s.GID, "gid", 0, "")
	fs.StringVar(&s.Source, "source", "", "")
	fs.StringVar(&s.SocketPath, "socket-path", "", "")
	if err := fs.Parse(args); err != nil {
		return s, err
	}
	rest := fs.Args()
	if len(rest) == 0 || s.UID <= 0 || s.GID <= 0 || s.Source == "" || s.SocketPath == "" {
		return s, errors.New("usage: " + Command + " --uid=N --gid=N --source=DIR --socket-path=SOCK -- VIRTIOFSD [ARGS...]")
	}
	s.Virtiofsd, s.Options = rest[0], rest[1:]
	return s, nil
}

// Main runs the jail and returns the exit code: virtiofsd's, or 1 when
// the jail could not be set up (the reason on stderr).
func Main(args []string, stderr io.Writer) int {
	s, err := parse(args)
	if err == nil {
		var code int
		code, err = run(s)
		if err == nil {
			return code
		}
	}
	fmt.Fprintf(stderr, "agent-vm virtiofsd jail: %v\n", err)
	return 1
}

// virtiofsdCaps are what QEMU's C virtiofsd keeps for itself (its
// setup_capabilities) plus what its own sandbox needs (new namespaces,
// pivot_root, dropping its bounding set). All are held inside the user
// namespace only.
var virtiofsdCaps = []uintptr{unix.CAP_CHOWN, unix.CAP_DAC_OVERRIDE, unix.CAP_FOWNER, unix.CAP_FSETID,
	unix.CAP_SETGID, unix.CAP_SETUID, unix.CAP_MKNOD, unix.CAP_SETFCAP, unix.CAP_SYS_ADMIN, unix.CAP_SETPCAP}

func run(s Spec) (int, error) {
	if os.Geteuid() != 0 {
		return 0, errors.New("the jail needs root (it maps the workspace owner into a user namespace)")
	}
	// Mount namespaces are per thread: this goroutine keeps its thread,
	// which makes the mounts and starts virtiofsd.
	runtime.LockOSThread()
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return 0, fmt.Errorf("new mount namespace: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return 0, fmt.Errorf("making mounts private: %w", err)
	}
	// The socket first: it may be under /tmp, which the bind mount hides.
	_ = os.Remove(s.SocketPath)
	ln, err := net.Listen("unix", s.SocketPath)
	if err != nil {
		return 0, fmt.Errorf("listening on %s: %w", s.SocketPath, err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	sock, err := ln.(*net.UnixListener).File()
	if err != nil {
		return 0, err
	}
	if err := os.Chmod(s.SocketPath, 0o600); err != nil {
		return 0, err
	}
	src, err := os.OpenFile(s.Source, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return 0, fmt.Errorf("opening the workspace: %w", err)
	}
	if err := unix.Mount("/proc/self/fd/"+strconv.Itoa(int(src.Fd())), mountPoint, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return 0, fmt.Errorf("bind-mounting the workspace on %s: %w", mountPoint, err)
	}
	src.Close()
	if err := syscall.Setgroups(nil); err != nil {
		return 0, fmt.Errorf("dropping supplementary groups: %w", err)
	}
	if err := installFilter(); err != nil {
		return 0, fmt.Errorf("seccomp filter: %w", err)
	}
	cmd := exec.Command(s.Virtiofsd, append([]string{"--fd=3", "-o", "source=" + mountPoint}, s.Options...)...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.ExtraFiles = []*os.File{sock}
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: s.UID, HostID: s.UID, Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: s.GID, HostID: s.GID, Size: 1}},
		Credential:  &syscall.Credential{Uid: uint32(s.UID), Gid: uint32(s.GID), NoSetGroups: true},
		AmbientCaps: virtiofsdCaps,
		Pdeathsig:   syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("starting %s: %w", s.Virtiofsd, err)
	}
	sock.Close()
	ln.Close()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	go func() {
		for sig := range sigs {
			_ = cmd.Process.Signal(sig)
		}
	}()
	err = cmd.Wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode() & 0xff, nil
	}
	return 0, err
}
