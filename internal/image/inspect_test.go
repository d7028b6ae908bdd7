package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/execx/execxtest"
	"github.com/agent-vm/agent-vm/internal/testutil"
)

func TestInspectAcceptsDiskImages(t *testing.T) {
	testutil.Program(t, "qemu-img")
	testutil.Program(t, "mkfs.ext4")
	dir := t.TempDir()
	ctx := context.Background()

	qcow := makeQcow2(t, dir, "base.qcow2", 64<<20)
	ext4 := filepath.Join(dir, "ext4.raw")
	writeFile(t, ext4, 8<<20, nil)
	run(t, "mkfs.ext4", "-q", "-F", ext4)
	mbr := writeFile(t, filepath.Join(dir, "mbr.img"), 2<<20, map[int]string{510: "\x55\xaa"})
	gpt := writeFile(t, filepath.Join(dir, "gpt.img"), 2<<20, map[int]string{510: "\x55\xaa", 512: "EFI PART"})

	for _, tc := range []struct {
		path, format string
		size         int64
	}{
		{qcow, "qcow2", 64 << 20},
		{ext4, "raw", 8 << 20},
		{mbr, "raw", 2 << 20},
		{gpt, "raw", 2 << 20},
	} {
		t.Run(filepath.Base(tc.path), func(t *testing.T) {
			d, err := Inspect(ctx, execx.OS{}, tc.path)
			if err != nil {
				t.Fatal(err)
			}
			if d.Format != tc.format || d.VirtualSize != tc.size || d.Path != tc.path || d.BackingFile != "" {
				t.Errorf("got %+v, want format %s, size %d, path %s, no backing file", d, tc.format, tc.size, tc.path)
			}
		})
	}
}

func TestInspectRelativePathBecomesAbsolute(t *testing.T) {
	testutil.Program(t, "qemu-img")
	dir := t.TempDir()
	makeQcow2(t, dir, "rel.qcow2", 1<<20)
	t.Chdir(dir)
	d, err := Inspect(context.Background(), execx.OS{}, "rel.qcow2")
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "rel.qcow2"); d.Path != want {
		t.Errorf("got path %q, want %q", d.Path, want)
	}
}

// TestInspectRejectsWhatUsersPassByMistake runs the real qemu-img on files
// that are not disk images. qemu-img calls most of them "raw"; Inspect must
// still say what they are and what to do.
func TestInspectRejectsWhatUsersPassByMistake(t *testing.T) {
	testutil.Program(t, "qemu-img")
	dir := t.TempDir()
	ctx := context.Background()

	base := makeQcow2(t, dir, "gone-base.qcow2", 1<<20)
	orphan := filepath.Join(dir, "orphan.qcow2")
	run(t, "qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", base, orphan)
	if err := os.Remove(base); err != nil {
		t.Fatal(err)
	}
	vmdk := filepath.Join(dir, "disk.vmdk")
	run(t, "qemu-img", "create", "-q", "-f", "vmdk", vmdk, "16M")
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write(bytes.Repeat([]byte("qcow"), 1<<18))
	_ = zw.Close()
	gzPath := filepath.Join(dir, "debian.qcow2.gz")
	if err := os.WriteFile(gzPath, gz.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	_ = tw.WriteHeader(&tar.Header{Name: "disk.raw", Mode: 0o644, Size: 2 << 20})
	_, _ = tw.Write(make([]byte, 2<<20))
	_ = tw.Close()
	tarPath := filepath.Join(dir, "nocloud.tar")
	if err := os.WriteFile(tarPath, tb.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		path string
		want []string
	}{
		{"missing", filepath.Join(dir, "nope.qcow2"), []string{"nope.qcow2", "does not exist", "hint:"}},
		{"directory", dir, []string{"is a directory", "hint:"}},
		{"fifo", fifo, []string{"not a regular file"}},
		{"empty", writeFile(t, filepath.Join(dir, "empty.img"), 0, nil), []string{"empty.img", "too small"}},
		{"zeros", writeFile(t, filepath.Join(dir, "zeros.img"), 4<<20, nil), []string{"no partition table or filesystem", "hint:"}},
		{"text", writeFile(t, filepath.Join(dir, "notes.txt"), 3<<20, map[int]string{0: "hello, this is text"}), []string{"does not look like a disk image"}},
		{"iso", writeFile(t, filepath.Join(dir, "debian-netinst.iso"), 4<<20, map[int]string{510: "\x55\xaa", 0x8001: "CD001"}), []string{"ISO 9660", "pull debian-12"}},
		{"gzip", gzPath, []string{"gzip-compressed", "unpack it first"}},
		{"tar", tarPath, []string{"tar archive", "unpack it first"}},
		{"kernel", writeFile(t, filepath.Join(dir, "vmlinuz"), 2<<20, map[int]string{510: "\x55\xaa", 0x202: "HdrS"}), []string{"Linux kernel"}},
		{"vmdk", vmdk, []string{"vmdk format", "qemu-img convert -O qcow2"}},
		{"orphan overlay", orphan, []string{"backing file", "gone-base.qcow2", "is missing"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := Inspect(ctx, execx.OS{}, tc.path)
			if err == nil {
				t.Fatalf("got %+v, want an error", d)
			}
			wantErr(t, err, tc.want...)
		})
	}
}

func TestInspectNamesTheMissingQemuImg(t *testing.T) {
	// FAKE runner at the exec boundary: qemu-img is not installed.
	fake := execxtest.New(t).Installed("qemu-img", "")
	dir := t.TempDir()
	p := writeFile(t, filepath.Join(dir, "disk.img"), 2<<20, map[int]string{510: "\x55\xaa"})
	_, err := Inspect(context.Background(), fake, p)
	wantErr(t, err, "qemu-img not found", "apt-get install qemu-utils")
	if n := len(fake.Calls()); n != 0 {
		t.Errorf("ran %d programs, want none", n)
	}
}

func TestNotADiskMagicOffsets(t *testing.T) {
	// The ISO check must win over the MBR a hybrid ISO also carries.
	h := make([]byte, 68<<10)
	copy(h[510:], "\x55\xaa")
	copy(h[0x8001:], "CD001")
	if what, _ := notADisk(h); !strings.Contains(what, "ISO") {
		t.Errorf("hybrid ISO: got %q", what)
	}
	if !looksLikeDisk(h) {
		t.Error("an MBR should look like a disk")
	}
	if what, _ := notADisk(make([]byte, 100)); what != "" {
		t.Errorf("short zero header: got %q, want nothing", what)
	}
}

func TestInspectImageInUseByQemu(t *testing.T) {
	testutil.Program(t, "qemu-img")
	testutil.Program(t, "qemu-system-x86_64")
	dir := t.TempDir()
	disk := makeQcow2(t, dir, "busy.qcow2", 16<<20)
	// A paused QEMU (-S) holds the disk's write lock, as a running VM does.
	p, err := execx.OS{}.Start(execx.Detached{Path: "qemu-system-x86_64",
		Args:       []string{"-S", "-nodefaults", "-display", "none", "-accel", "tcg", "-drive", "file=" + disk + ",if=virtio,format=qcow2"},
		StdoutPath: filepath.Join(dir, "qemu.log")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(p.Pid(), syscall.SIGKILL)
		<-p.Exited()
	})
	// Inspect only once QEMU holds the lock: its qemu-img taking the lock
	// while QEMU opens the disk would make QEMU fail (under load, QEMU
	// starts slowly enough for that). QEMU's locks are OFD locks on bytes
	// from 100 on, seen here without taking one.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for !qemuLocked(t, disk) {
		select {
		case <-p.Exited():
			log, _ := os.ReadFile(filepath.Join(dir, "qemu.log"))
			t.Fatalf("qemu exited early (code %d); its output:\n%s", p.ExitCode(), log)
		case <-ctx.Done():
			t.Fatal("qemu never took the disk's lock")
		case <-time.After(100 * time.Millisecond):
		}
	}
	_, err = Inspect(ctx, execx.OS{}, disk)
	wantErr(t, err, "in use by a running QEMU", "hint: stop the VM")
}

// qemuLocked says whether a process holds a lock on disk's bytes from 100
// on, as QEMU does on an image it has open (F_OFD_GETLK takes none).
func qemuLocked(t *testing.T, disk string) bool {
	t.Helper()
	f, err := os.Open(disk)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: 100, Len: 0}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_GETLK, &lk); err != nil {
		t.Fatal(err)
	}
	return lk.Type != unix.F_UNLCK
}
