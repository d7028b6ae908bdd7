// Package qemutest holds a FAKE QEMU (and virtiofsd) for tests: the test
// binary itself, re-executed with FakeEnv set, standing at the exec boundary
// where the launcher starts QEMU or a run script.
//
// It is a real process whose command line is the one the launcher built
// (-uuid, -pidfile, -qmp ...), so everything that finds and verifies a VM's
// QEMU through /proc sees it as it would see QEMU. It writes its pid file,
// serves QMP on the -qmp socket (greeting, qmp_capabilities, query-status,
// system_powerdown and quit, which end it) and logs each QMP command it gets
// on stdout (the launcher's qemu.log) as "qmp: <command>". It also plays
// QEMU's part in a suspend and a resume: getfd (the descriptor arrives as
// SCM_RIGHTS), stop, cont, device_del (DEVICE_DELETED at once), device_add,
// chardev-add and chardev-remove (which closes the virtiofsd connection),
// migrate to "fd:NAME" (writes StateMagic and the VM's uuid), migrate-incoming
// from one (reads them back; another VM's state fails the load) and
// query-migrate; with FailEnv=migrate its migrate fails. It takes
// migrate-set-capabilities' x-ignore-shared: a state saved with it says
// so, loads only where it is set too, and then leaves the guest memory as
// the loader wrote it (without it a load writes MemoryPattern, the RAM
// the stream carried). With StopWriteEnv
// set, a stop first writes StopWriteContent to the file it names: the
// guest's last write before the pause. Given a
// memory-backend-memfd object it holds a memfd of that name and size, as
// QEMU's guest memory, with MemoryPattern written at its start and its
// end (not when it starts -incoming: a restore's memory is fresh).
// Asked --version it prints Version, or VersionEnv's. Given
// --socket-path it is a virtiofsd instead: it listens on that socket until a
// signal ends it. Tests that use it say so.
package qemutest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-vm/agent-vm/internal/sharejail"
)

// FakeEnv selects the fake: "qemu" behaves as described above; "stubborn"
// also ignores system_powerdown, quit and SIGTERM (only SIGKILL ends it).
const FakeEnv = "AGENT_VM_FAKE_QEMU"

// FailEnv names a step the fake fails: "migrate".
const FailEnv = "AGENT_VM_FAKE_QEMU_FAIL"

// Version is the fake's QEMU version (--version and the QMP greeting)
// unless VersionEnv gives another ("7.2.0").
const Version = "8.2.0"

// VersionEnv names the variable that sets the fake's version.
const VersionEnv = "AGENT_VM_FAKE_QEMU_VERSION"

func version() string {
	if v := os.Getenv(VersionEnv); v != "" {
		return v
	}
	return Version
}

// StopWriteEnv names a file the fake writes StopWriteContent to when it
// is stopped, before it answers.
const StopWriteEnv = "AGENT_VM_FAKE_QEMU_STOP_WRITE"

// StopWriteContent is what a stop writes (its length is the test's
// choice: a file of another content but the same size is a change only
// its times tell).
const StopWriteContent = "written as the pause began\n"

// StateMagic starts the fake's saved state.
const StateMagic = "FAKE-QEMU-STATE "

// MemoryPattern is what the fake writes at the start and the end of its
// guest memory.
const MemoryPattern = "FAKE-GUEST-MEMORY"

// lifetime bounds a fake a test forgot to end.
const lifetime = 5 * time.Minute

// Main runs the fake and exits when FakeEnv is set; otherwise it returns.
// Call it first thing in TestMain.
func Main() {
	if len(os.Args) > 1 && os.Args[1] == sharejail.Command {
		// The launcher runs virtiofsd's jail as its own binary, which in
		// a test is the test binary.
		os.Exit(sharejail.Main(os.Args[2:], os.Stderr))
	}
	mode := os.Getenv(FakeEnv)
	if mode == "" {
		return
	}
	go func() { time.Sleep(lifetime); os.Exit(3) }()
	args := os.Args[1:]
	if len(args) == 1 && args[0] == "--version" {
		fmt.Println("QEMU emulator version " + version() + " (fake)")
		os.Exit(0)
	}
	if sock := argAfter(args, "--socket-path"); sock != "" {
		os.Exit(virtiofsd(sock))
	}
	os.Exit(fakeQEMU(args, mode == "stubborn"))
}

// Script is the program and whole environment that start the fake in place
// of a run script (qemu.Script; the launcher appends the QEMU arguments it
// needs). stubborn picks the fake that only SIGKILL ends. As virtiofsd
// (virtiofsd.Binary{Path: path, Rust: true}) the fake gets the test process's
// environment, so the caller sets FakeEnv there (t.Setenv(FakeEnv, "qemu")).
//
// It returns plain values: package qemu's own tests use the fake, and a
// qemu.Boot here would make an import cycle.
func Script(stubborn bool) (path string, env []string, err error) {
	exe, err := os.Executable()
	if err != nil {
		return "", nil, err
	}
	mode := "qemu"
	if stubborn {
		mode = "stubborn"
	}
	env = []string{FakeEnv + "=" + mode}
	for _, v := range []string{StopWriteEnv, VersionEnv} {
		if p := os.Getenv(v); p != "" {
			env = append(env, v+"="+p)
		}
	}
	return exe, env, nil
}

func fakeQEMU(args []string, stubborn bool) int {
	if stubborn {
		signal.Ignore(syscall.SIGTERM)
	}
	qmpArg := argAfter(args, "-qmp")
	pidfile := argAfter(args, "-pidfile")
	if !strings.HasPrefix(qmpArg, "unix:") || pidfile == "" {
		fmt.Println("fake qemu: need -qmp unix:PATH,... and -pidfile PATH")
		return 1
	}
	sock, _, _ := strings.Cut(strings.TrimPrefix(qmpArg, "unix:"), ",server=")
	sock = strings.ReplaceAll(sock, ",,", ",")
	_ = os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		fmt.Println("fake qemu:", err)
		return 1
	}
	if err := os.WriteFile(pidfile, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600); err != nil {
		fmt.Println("fake qemu:", err)
		return 1
	}
	vm := &machine{uuid: argAfter(args, "-uuid"), status: "running", fds: map[string]*os.File{}}
	mem, err := guestMemory(args, argAfter(args, "-incoming") == "")
	if err != nil {
		fmt.Println("fake qemu:", err)
		return 1
	} else if mem != nil {
		defer mem.Close()
	}
	vm.mem = mem
	if argAfter(args, "-incoming") != "" {
		vm.status = "inmigrate"
	}
	// Like QEMU, hold virtiofsd's socket while running: virtiofsd exits
	// when it closes.
	if fs := chardevPath(args); fs != "" {
		c, err := net.Dial("unix", fs)
		if err != nil {
			fmt.Println("fake qemu:", err)
			return 1
		}
		vm.chardev = c
		defer c.Close()
	}
	for {
		conn, err := ln.Accept()
		if err != nil {
			return 1
		}
		if serveQMP(conn.(*net.UnixConn), vm, stubborn) {
			_ = os.Remove(sock)
			_ = os.Remove(pidfile)
			return 0
		}
	}
}

// guestMemory makes the memfd of a memory-backend-memfd on the command
// line (nil when there is none), MemoryPattern written in it if booted.
func guestMemory(args []string, booted bool) (*os.File, error) {
	obj := ""
	for i, a := range args {
		if a == "-object" && i+1 < len(args) && strings.HasPrefix(args[i+1], "memory-backend-memfd,") {
			obj = args[i+1]
		}
	}
	if obj == "" {
		return nil, nil
	}
	_, sz, _ := strings.Cut(obj, "size=")
	sz, _, _ = strings.Cut(sz, ",")
	mib, err := strconv.Atoi(strings.TrimSuffix(sz, "M"))
	if err != nil {
		return nil, fmt.Errorf("memory size %q", sz)
	}
	fd, err := unix.MemfdCreate("memory-backend-memfd", 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "memory-backend-memfd")
	if err := f.Truncate(int64(mib) << 20); err != nil {
		return nil, err
	}
	if !booted {
		return f, nil
	}
	return f, writePattern(f)
}

// writePattern writes MemoryPattern at the start and the end of mem.
func writePattern(mem *os.File) error {
	fi, err := mem.Stat()
	if err != nil {
		return err
	}
	if _, err := mem.WriteAt([]byte(MemoryPattern), 0); err != nil {
		return err
	}
	_, err = mem.WriteAt([]byte(MemoryPattern), fi.Size()-int64(len(MemoryPattern)))
	return err
}

// machine is the fake's state across QMP connections.
type machine struct {
	uuid      string
	status    string // query-status
	migration string // query-migrate
	chardev   io.Closer
	fds       map[string]*os.File // getfd, by name
	pending   []*os.File          // descriptors received, not yet named
	mem       *os.File            // the guest memory, if any
	// ignoreShared is the migration capability x-ignore-shared.
	ignoreShared bool
}

// serveQMP answers one QMP client; it reports whether QEMU should exit.
func serveQMP(conn *net.UnixConn, vm *machine, stubborn bool) bool {
	defer conn.Close()
	enc := json.NewEncoder(conn)
	_ = enc.Encode(map[string]any{"QMP": map[string]any{
		"version":      map[string]any{"qemu": versionJSON()},
		"capabilities": []string{}}})
	sc := bufio.NewScanner(&fdReader{conn: conn, vm: vm})
	for sc.Scan() {
		var req struct {
			Execute   string            `json:"execute"`
			ID        json.RawMessage   `json:"id"`
			Arguments map[string]string `json:"arguments"`
		}
		var caps struct {
			Arguments struct {
				Capabilities []struct {
					Capability string `json:"capability"`
					State      bool   `json:"state"`
				} `json:"capabilities"`
			} `json:"arguments"`
		}
		var chardevFd struct {
			Arguments struct {
				Backend struct {
					Data struct {
						Addr struct {
							Data struct {
								Str string `json:"str"`
							} `json:"data"`
						} `json:"addr"`
					} `json:"data"`
				} `json:"backend"`
			} `json:"arguments"`
		}
		if json.Unmarshal(sc.Bytes(), &req) != nil {
			// chardev-add's arguments nest
			var loose struct {
				Execute string          `json:"execute"`
				ID      json.RawMessage `json:"id"`
			}
			if json.Unmarshal(sc.Bytes(), &loose) != nil || json.Unmarshal(sc.Bytes(), &chardevFd) != nil || json.Unmarshal(sc.Bytes(), &caps) != nil {
				return false
			}
			req.Execute, req.ID = loose.Execute, loose.ID
		}
		fmt.Println("qmp:", req.Execute)
		reply := map[string]any{"id": req.ID, "return": map[string]any{}}
		var event map[string]any
		switch req.Execute {
		case "qmp_capabilities", "system_powerdown", "quit", "device_add":
		case "chardev-add":
			f := vm.fds[chardevFd.Arguments.Backend.Data.Addr.Data.Str]
			if f == nil {
				reply = errorReply(req.ID, "GenericError", "fake qemu: chardev-add needs a socket passed with getfd")
				break
			}
			vm.chardev = f
		case "query-status":
			reply["return"] = map[string]any{"status": vm.status, "running": vm.status == "running"}
		case "stop":
			if p := os.Getenv(StopWriteEnv); p != "" {
				if err := os.WriteFile(p, []byte(StopWriteContent), 0o644); err != nil {
					reply = errorReply(req.ID, "GenericError", "fake qemu: "+err.Error())
					break
				}
			}
			vm.status = "paused"
		case "cont":
			vm.status = "running"
		case "getfd":
			if len(vm.pending) == 0 {
				reply = errorReply(req.ID, "GenericError", "No file descriptor supplied via SCM_RIGHTS")
				break
			}
			vm.fds[req.Arguments["fdname"]], vm.pending = vm.pending[0], vm.pending[1:]
		case "device_del":
			event = map[string]any{"event": "DEVICE_DELETED", "data": map[string]string{"device": req.Arguments["id"]}}
		case "chardev-remove":
			if vm.chardev != nil {
				vm.chardev.Close()
				vm.chardev = nil
			}
		case "migrate":
			vm.migration = vm.save(req.Arguments["uri"])
		case "migrate-incoming":
			vm.migration = vm.load(req.Arguments["uri"])
		case "query-migrate":
			reply["return"] = map[string]any{"status": vm.migration}
		case "migrate-set-capabilities":
			for _, c := range caps.Arguments.Capabilities {
				if c.Capability != "x-ignore-shared" {
					reply = errorReply(req.ID, "GenericError", "fake qemu: no capability "+c.Capability)
					break
				}
				vm.ignoreShared = c.State
			}
		default:
			reply = errorReply(req.ID, "CommandNotFound", "fake qemu: no "+req.Execute)
		}
		_ = enc.Encode(reply)
		if event != nil {
			_ = enc.Encode(event)
		}
		if !stubborn && (req.Execute == "system_powerdown" || req.Execute == "quit") {
			return true
		}
	}
	return false
}

// versionJSON is version() as the QMP greeting gives it.
func versionJSON() map[string]int {
	var major, minor, micro int
	fmt.Sscanf(version(), "%d.%d.%d", &major, &minor, &micro)
	return map[string]int{"major": major, "minor": minor, "micro": micro}
}

func errorReply(id json.RawMessage, class, desc string) map[string]any {
	return map[string]any{"id": id, "error": map[string]string{"class": class, "desc": desc}}
}

// save writes the fake state to the descriptor uri names: the migration's
// status.
func (vm *machine) save(uri string) string {
	f := vm.fds[strings.TrimPrefix(uri, "fd:")]
	if f == nil || os.Getenv(FailEnv) == "migrate" {
		return "failed"
	}
	if _, err := f.WriteString(vm.state()); err != nil {
		return "failed"
	}
	return "completed"
}

// state is the fake's saved state: StateMagic, the uuid, and whether
// the RAM was left out.
func (vm *machine) state() string {
	if vm.ignoreShared {
		return StateMagic + vm.uuid + " ignore-shared\n"
	}
	return StateMagic + vm.uuid + "\n"
}

// load reads a fake state back: only this VM's loads.
func (vm *machine) load(uri string) string {
	f := vm.fds[strings.TrimPrefix(uri, "fd:")]
	if f == nil {
		return "failed"
	}
	b, err := io.ReadAll(f)
	if err != nil || string(b) != vm.state() {
		return "failed"
	}
	if !vm.ignoreShared && vm.mem != nil {
		if writePattern(vm.mem) != nil {
			return "failed"
		}
	}
	vm.status = "paused"
	return "completed"
}

// fdReader reads a QMP connection and keeps the descriptors that arrive
// with it (getfd).
type fdReader struct {
	conn *net.UnixConn
	vm   *machine
}

func (r *fdReader) Read(b []byte) (int, error) {
	oob := make([]byte, 128)
	n, oobn, _, _, err := r.conn.ReadMsgUnix(b, oob)
	if oobn > 0 {
		msgs, _ := syscall.ParseSocketControlMessage(oob[:oobn])
		for _, m := range msgs {
			fds, _ := syscall.ParseUnixRights(&m)
			for _, fd := range fds {
				r.vm.pending = append(r.vm.pending, os.NewFile(uintptr(fd), "getfd"))
			}
		}
	}
	return n, err
}

func virtiofsd(sock string) int {
	_ = os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		fmt.Println("fake virtiofsd:", err)
		return 1
	}
	// An old fake that exits late must not remove the socket of the next
	// one (Go unlinks a listener's socket on Close by default).
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	defer ln.Close()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	hangup := make(chan struct{})
	go func() {
		// Serve one QEMU until it goes, as virtiofsd does.
		if c, err := ln.Accept(); err == nil {
			_, _ = io.Copy(io.Discard, c)
			close(hangup)
		}
	}()
	select {
	case <-sig:
	case <-hangup:
	}
	return 0
}

// chardevPath is the socket path of the -chardev socket (virtiofs), if any.
func chardevPath(args []string) string {
	for _, opt := range strings.Split(argAfter(args, "-chardev"), ",") {
		if p, ok := strings.CutPrefix(opt, "path="); ok {
			return p
		}
	}
	return ""
}

// argAfter returns the argument after flag ("--flag value" or "--flag=value").
func argAfter(args []string, flag string) string {
	for i, a := range args {
		if a == flag && i+1 < len(args) {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v
		}
	}
	return ""
}
