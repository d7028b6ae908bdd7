package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/agent-vm/agent-vm/blackbox"
)

// The reference for boots is the same guest booted by QEMU alone: the
// command line agent-vm ran (read from /proc), without what agent-vm adds
// around the guest (virtiofsd and its shared memory, the fw_cfg
// credential, QMP, the pid file, the MCP port forward), on an overlay of
// its own over the same base image, with a copy of the VM's seed ISO (so
// cloud-init provisions it the same way and sshd presents the VM's pinned
// host key). Ready means OpenSSH logs in with the VM's key, checking the
// pinned host key.

// bareFiles are a bare boot's own files.
type bareFiles struct {
	Disk, Seed, Console, Log string
	SSHPort                  int
}

// optionValue reads key=value from a QEMU option string (commas doubled
// inside values are not expected in the paths the harness makes).
func optionValue(opts, key string) string {
	for _, kv := range strings.Split(opts, ",") {
		if v, ok := strings.CutPrefix(kv, key+"="); ok {
			return v
		}
	}
	return ""
}

// driveFile is the file of a -drive option, and whether it is the
// overlay (qcow2) rather than the seed (raw, read-only).
func driveFile(opts string) (file string, overlay bool) {
	return optionValue(opts, "file"), optionValue(opts, "format") == "qcow2"
}

// overlayPath is the VM's disk in its QEMU command line.
func overlayPath(argv []string) (string, error) {
	for i := 0; i+1 < len(argv); i++ {
		if argv[i] == "-drive" {
			if f, overlay := driveFile(argv[i+1]); overlay {
				return f, nil
			}
		}
	}
	return "", fmt.Errorf("no qcow2 -drive in the VM's QEMU command line %q", strings.Join(argv, " "))
}

// seedPath is the VM's seed ISO in its QEMU command line.
func seedPath(argv []string) (string, error) {
	for i := 0; i+1 < len(argv); i++ {
		if argv[i] == "-drive" {
			if f, overlay := driveFile(argv[i+1]); !overlay && f != "" {
				return f, nil
			}
		}
	}
	return "", fmt.Errorf("no seed -drive in the VM's QEMU command line %q", strings.Join(argv, " "))
}

// sshForward matches the SSH port forward of a -netdev user option.
var sshForward = regexp.MustCompile(`hostfwd=tcp:127\.0\.0\.1:\d+-:22\b`)

// bareArgv turns the QEMU command line agent-vm ran into the bare
// reference's: the same machine, kernel, disks and network, without
// agent-vm's additions, on the bare boot's files.
func bareArgv(vm []string, f bareFiles, name string) ([]string, error) {
	if len(vm) < 2 {
		return nil, fmt.Errorf("empty QEMU command line")
	}
	out := []string{vm[0]}
	var sawDisk, sawSeed, sawNet bool
	for i := 1; i < len(vm); i++ {
		opt := vm[i]
		val := ""
		if i+1 < len(vm) && strings.HasPrefix(opt, "-") && !strings.HasPrefix(vm[i+1], "-") {
			val = vm[i+1]
		}
		switch opt {
		case "-uuid", "-qmp", "-pidfile", "-fw_cfg", "-numa", "-virtfs":
			i++ // agent-vm's own handles and credentials
			continue
		case "-object":
			if strings.HasPrefix(val, "memory-backend-memfd") {
				i++
				continue
			}
		case "-chardev":
			if strings.Contains(val, "virtiofsd") {
				i++
				continue
			}
		case "-device":
			if strings.HasPrefix(val, "vhost-user-fs") {
				i++
				continue
			}
		case "-name":
			val = name
		case "-serial":
			val = "file:" + f.Console
		case "-drive":
			file, overlay := driveFile(val)
			if overlay {
				val, sawDisk = strings.Replace(val, "file="+file, "file="+f.Disk, 1), true
			} else {
				val, sawSeed = strings.Replace(val, "file="+file, "file="+f.Seed, 1), true
			}
		case "-netdev":
			var keep []string
			for _, kv := range strings.Split(val, ",") {
				if strings.HasPrefix(kv, "hostfwd=") && !sshForward.MatchString(kv) {
					continue // the MCP port: nothing answers there without agent-vm
				}
				keep = append(keep, kv)
			}
			val = sshForward.ReplaceAllString(strings.Join(keep, ","), fmt.Sprintf("hostfwd=tcp:127.0.0.1:%d-:22", f.SSHPort))
			sawNet = strings.Contains(val, "hostfwd=")
		}
		out = append(out, opt)
		if val != "" {
			out = append(out, val)
			i++
		}
	}
	if !sawDisk || !sawSeed || !sawNet {
		return nil, fmt.Errorf("the VM's QEMU command line lacks a disk, seed or SSH forward the bare boot could reuse: %q", strings.Join(vm, " "))
	}
	return out, nil
}

// diskSize is an image file's size: allocated on disk, and apparent.
type diskSize struct {
	Allocated int64 `json:"allocated"`
	File      int64 `json:"file"`
}

// imageSize reads an image's sizes with qemu-img (-U: it may be in use).
func imageSize(ctx context.Context, path string) (diskSize, error) {
	info, err := qemuImgInfo(ctx, path)
	if err != nil {
		return diskSize{}, err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return diskSize{}, err
	}
	return diskSize{Allocated: info.ActualSize, File: fi.Size()}, nil
}

type imgInfo struct {
	VirtualSize  int64  `json:"virtual-size"`
	ActualSize   int64  `json:"actual-size"`
	BackingFile  string `json:"full-backing-filename"`
	BackingFmt   string `json:"backing-filename-format"`
	FormatString string `json:"format"`
}

func qemuImgInfo(ctx context.Context, path string) (*imgInfo, error) {
	res := runCmd(ctx, cmdSpec{Path: "qemu-img", Args: []string{"info", "-U", "--output=json", path}, Timeout: quickTimeout})
	if res.Err != nil {
		return nil, res.Err
	}
	var info imgInfo
	if err := json.Unmarshal([]byte(res.Stdout), &info); err != nil {
		return nil, fmt.Errorf("reading `%s`: %w", res.Line, err)
	}
	return &info, nil
}

// bareVM is a bare QEMU the harness runs.
type bareVM struct {
	files   bareFiles
	argv    []string
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
	target  sshTarget
}

// newBare prepares a bare boot of vm's guest in dir: a fresh overlay over
// vm's base image, a copy of its seed, its known_hosts for another port.
func (l *lab) newBare(ctx context.Context, vm *labVM, st *blackbox.Status, dir string) (*bareVM, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	f := bareFiles{Disk: filepath.Join(dir, "disk.qcow2"), Seed: filepath.Join(dir, "seed.iso"),
		Console: filepath.Join(dir, "console.log"), Log: filepath.Join(dir, "qemu.log"), SSHPort: port}
	disk, err := overlayPath(vm.argv)
	if err != nil {
		return nil, err
	}
	seed, err := seedPath(vm.argv)
	if err != nil {
		return nil, err
	}
	info, err := qemuImgInfo(ctx, disk)
	if err != nil {
		return nil, err
	}
	if info.BackingFile == "" {
		return nil, fmt.Errorf("%s has no backing file: the bare boot needs the base image agent-vm's overlay sits on", disk)
	}
	res := runCmd(ctx, cmdSpec{Path: "qemu-img", Args: []string{"create", "-q", "-f", "qcow2", "-F", orDefault(info.BackingFmt, "qcow2"),
		"-b", info.BackingFile, f.Disk, fmt.Sprint(info.VirtualSize)}, Timeout: quickTimeout})
	if res.Err != nil {
		return nil, res.Err
	}
	if err := copyFile(seed, f.Seed); err != nil {
		return nil, err
	}
	kh := filepath.Join(dir, "known_hosts")
	if err := rewriteKnownHosts(st.SSH.KnownHostsFile, kh, st.SSH.Port, port); err != nil {
		return nil, err
	}
	argv, err := bareArgv(vm.argv, f, "bench-bare-"+vm.name)
	if err != nil {
		return nil, err
	}
	return &bareVM{files: f, argv: argv, target: sshTarget{Port: port, User: st.SSH.User, Key: st.SSH.IdentityFile, KnownHosts: kh}}, nil
}

// boot starts the bare QEMU and returns the seconds until OpenSSH logs in.
func (l *lab) bootBare(ctx context.Context, b *bareVM) (float64, error) {
	log, err := os.Create(b.files.Log)
	if err != nil {
		return 0, err
	}
	defer log.Close()
	b.cmd = exec.Command(b.argv[0], b.argv[1:]...)
	b.cmd.Stdout, b.cmd.Stderr = log, log
	b.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	b.exited = make(chan struct{})
	began := time.Now()
	if err := b.cmd.Start(); err != nil {
		return 0, fmt.Errorf("starting the bare QEMU: %w", err)
	}
	l.mu.Lock()
	l.bares[b] = struct{}{}
	l.mu.Unlock()
	go func() { b.waitErr = b.cmd.Wait(); close(b.exited) }()
	if err := waitSSH(ctx, b.target, b.exited); err != nil {
		return 0, fmt.Errorf("bare QEMU boot: %w (console: %s; QEMU: %s)", err, tailFile(b.files.Console, 3), tailFile(b.files.Log, 2))
	}
	return time.Since(began).Seconds(), nil
}

// shutdown powers the bare guest off cleanly (its overlay boots again for
// the later-boot figure), killing QEMU if the guest does not go down.
func (l *lab) shutdown(ctx context.Context, b *bareVM) error {
	defer func() {
		l.mu.Lock()
		delete(l.bares, b)
		l.mu.Unlock()
	}()
	if b.cmd == nil {
		return nil
	}
	// Let cloud-init finish its first boot first, as agent-vm's start does
	// (it settles before returning): otherwise the bare guest's later boot
	// provisions again and the later-boot reference is not the same boot.
	_ = sshRun(ctx, b.target, 5*time.Minute, "cloud-init", "status", "--wait")
	_ = sshRun(ctx, b.target, 20*time.Second, "sudo", "systemctl", "poweroff")
	select {
	case <-b.exited:
		return nil
	case <-time.After(2 * time.Minute):
	case <-ctx.Done():
	}
	b.kill()
	return fmt.Errorf("the bare guest did not power off within 2 minutes; killed its QEMU")
}

// kill ends the bare QEMU at once.
func (b *bareVM) kill() {
	if b.cmd == nil || b.cmd.Process == nil {
		return
	}
	select {
	case <-b.exited:
		return
	default:
	}
	_ = b.cmd.Process.Kill()
	<-b.exited
}

// rewriteKnownHosts copies a known_hosts file with the host's port
// changed: the bare boot presents the same pinned key on another port.
func rewriteKnownHosts(from, to string, oldPort, newPort int) error {
	data, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	old, repl := fmt.Sprintf("[127.0.0.1]:%d ", oldPort), fmt.Sprintf("[127.0.0.1]:%d ", newPort)
	if !strings.Contains(string(data), old) {
		return fmt.Errorf("%s has no entry for %s", from, strings.TrimSpace(old))
	}
	return os.WriteFile(to, []byte(strings.ReplaceAll(string(data), old, repl)), 0o600)
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// tailFile is the last n lines of a file, "" if it cannot be read.
func tailFile(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return tail(string(data), n)
}

// freePort asks the kernel for a port on 127.0.0.1 that nothing uses now.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
