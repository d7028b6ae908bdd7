package sharejail

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

const childEnv = "AGENT_VM_SHAREJAIL_TEST_CHILD"

// TestMain: re-executed with childEnv set, this test binary installs the
// filter and tries what a guest could ask virtiofsd to do, in the
// directory childEnv names, printing one line per attempt.
func TestMain(m *testing.M) {
	if dir := os.Getenv(childEnv); dir != "" {
		os.Exit(child(dir))
	}
	os.Exit(m.Run())
}

func child(dir string) int {
	if err := installFilter(); err != nil {
		os.Stdout.WriteString("filter: " + err.Error() + "\n")
		return 1
	}
	p := func(n string) string { return filepath.Join(dir, n) }
	try := func(what string, err error) {
		res := "ok"
		if err != nil {
			res = err.Error()
		}
		os.Stdout.WriteString(what + ": " + res + "\n")
	}
	try("create 0644", os.WriteFile(p("plain"), nil, 0o644))
	try("chmod 0755", unix.Fchmodat(unix.AT_FDCWD, p("plain"), 0o755, 0))
	try("chmod 4755", unix.Fchmodat(unix.AT_FDCWD, p("plain"), 0o4755, 0))
	try("chmod 2755", unix.Fchmodat(unix.AT_FDCWD, p("plain"), 0o2755, 0))
	f, err := os.Open(p("plain"))
	if err == nil {
		try("fchmod 4755", unix.Fchmod(int(f.Fd()), 0o4755))
		f.Close()
	}
	_, err = unix.Open(p("suid-at-create"), unix.O_CREAT|unix.O_WRONLY, 0o4755)
	try("create 4755", err)
	try("mkdir 2755", unix.Mkdirat(unix.AT_FDCWD, p("sgid-dir"), 0o2755))
	try("mkdir 0755", unix.Mkdirat(unix.AT_FDCWD, p("dir"), 0o755))
	try("mknod regular", unix.Mknodat(unix.AT_FDCWD, p("regular"), unix.S_IFREG|0o644, 0))
	try("mkfifo", unix.Mknodat(unix.AT_FDCWD, p("fifo"), unix.S_IFIFO|0o644, 0))
	try("mknod socket", unix.Mknodat(unix.AT_FDCWD, p("sock"), unix.S_IFSOCK|0o644, 0))
	try("mknod char", unix.Mknodat(unix.AT_FDCWD, p("null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	try("setxattr", unix.Setxattr(p("plain"), "user.x", []byte("1"), 0))
	try("symlink", os.Symlink("/etc/shadow", p("link")))
	return 0
}

// The filter refuses set-id bits, special files and extended attributes,
// and lets ordinary file work through.
func TestFilter(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	eperm := syscall.EPERM.Error()
	want := map[string]string{
		"create 0644": "ok", "chmod 0755": "ok", "chmod 4755": eperm, "chmod 2755": eperm, "fchmod 4755": eperm,
		"create 4755": eperm, "mkdir 2755": eperm, "mkdir 0755": "ok", "mknod regular": "ok",
		"mkfifo": eperm, "mknod socket": eperm, "mknod char": eperm, "setxattr": eperm, "symlink": "ok",
	}
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		k, v, _ := strings.Cut(line, ": ")
		got[k] = v
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v\nwant %v", got, want)
	}
	fi, err := os.Stat(filepath.Join(dir, "plain"))
	if err != nil || fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 || fi.Mode().Perm() != 0o755 {
		t.Errorf("plain: %v %v", fi.Mode(), err)
	}
}

func TestArgsRoundTrip(t *testing.T) {
	s := Spec{UID: 1000, GID: 1001, Source: "/state/a b/workspace", SocketPath: "/state/run/virtiofsd.sock",
		Virtiofsd: "/usr/lib/qemu/virtiofsd", Options: []string{"-o", "cache=auto"}}
	args := s.Args()
	if args[0] != Command {
		t.Fatalf("args %q", args)
	}
	got, err := parse(args[1:])
	if err != nil || !reflect.DeepEqual(got, s) {
		t.Errorf("got %+v, %v; want %+v", got, err, s)
	}
	if _, err := parse([]string{"--uid=0", "--gid=0", "--source=/x", "--socket-path=/s", "--", "v"}); err == nil {
		t.Error("uid 0 accepted")
	}
}

func TestNoFilterForOtherArchitectures(t *testing.T) {
	if _, err := program("riscv64"); err == nil {
		t.Error("a filter for riscv64, whose numbers are not in the table")
	}
	for _, a := range []string{"amd64", "arm64"} {
		if p, err := program(a); err != nil || len(p) < 10 {
			t.Errorf("%s: %d instructions, %v", a, len(p), err)
		}
	}
}
