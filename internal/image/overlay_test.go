package image

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/execx/execxtest"
	"github.com/agent-vm/agent-vm/internal/testutil"
)

// qemuInfoJSON is the real qemu-img's view of a file, for assertions.
func qemuInfoJSON(t *testing.T, path string) gjson.Result {
	t.Helper()
	return gjson.Parse(run(t, "qemu-img", "info", "--output=json", path))
}

func TestCreateOverlay(t *testing.T) {
	testutil.Program(t, "qemu-img")
	ctx := context.Background()
	dir := t.TempDir()
	base := makeQcow2(t, dir, "base.qcow2", 64<<20)
	raw := writeFile(t, filepath.Join(dir, "base.raw"), 32<<20, map[int]string{510: "\x55\xaa"})

	for _, tc := range []struct {
		name, base, format, wantFormat string
		size, wantSize                 int64
	}{
		{"same size", base, "qcow2", "qcow2", 0, 64 << 20},
		{"grown", base, "qcow2", "qcow2", 8 << 30, 8 << 30},
		{"odd but aligned size", base, "qcow2", "qcow2", 64<<20 + 512, 64<<20 + 512},
		{"format detected", base, "", "qcow2", 0, 64 << 20},
		{"raw base", raw, "raw", "raw", 0, 32 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ov := filepath.Join(t.TempDir(), "overlay.qcow2")
			if err := CreateOverlay(ctx, execx.OS{}, tc.base, tc.format, ov, tc.size); err != nil {
				t.Fatal(err)
			}
			j := qemuInfoJSON(t, ov)
			if got := j.Get("format").String(); got != "qcow2" {
				t.Errorf("format: got %q, want qcow2", got)
			}
			if got := j.Get("virtual-size").Int(); got != tc.wantSize {
				t.Errorf("virtual size: got %d, want %d", got, tc.wantSize)
			}
			if got := j.Get("backing-filename").String(); got != tc.base {
				t.Errorf("backing file as written: got %q, want the absolute %q", got, tc.base)
			}
			if got := j.Get("backing-filename-format").String(); got != tc.wantFormat {
				t.Errorf("backing format: got %q, want %q", got, tc.wantFormat)
			}
			fi, err := os.Stat(ov)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != 0o600 {
				t.Errorf("mode: got %v, want 0600", fi.Mode().Perm())
			}
			if left := tempLeftovers(t, filepath.Dir(ov)); len(left) > 0 {
				t.Errorf("temporary files left: %q", left)
			}
		})
	}
}

// tempLeftovers lists hidden temporary files in dir.
func tempLeftovers(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			out = append(out, e.Name())
		}
	}
	return out
}

func TestCreateOverlayRelativeBaseIsStoredAbsolute(t *testing.T) {
	testutil.Program(t, "qemu-img")
	dir := t.TempDir()
	makeQcow2(t, dir, "base.qcow2", 16<<20)
	ovDir := t.TempDir()
	t.Chdir(dir)
	ov := filepath.Join(ovDir, "vm.qcow2")
	if err := CreateOverlay(context.Background(), execx.OS{}, "base.qcow2", "qcow2", ov, 0); err != nil {
		t.Fatal(err)
	}
	// A relative backing path would resolve against the overlay's directory.
	if got, want := qemuInfoJSON(t, ov).Get("backing-filename").String(), filepath.Join(dir, "base.qcow2"); got != want {
		t.Errorf("backing file: got %q, want %q", got, want)
	}
}

func TestCreateOverlayRefuses(t *testing.T) {
	testutil.Program(t, "qemu-img")
	ctx := context.Background()
	dir := t.TempDir()
	base := makeQcow2(t, dir, "base.qcow2", 64<<20)
	existing := filepath.Join(dir, "existing.qcow2")
	if err := os.WriteFile(existing, []byte("a VM's precious disk"), 0o600); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name, base, format, overlay string
		size                        int64
		want                        []string
	}{
		{"existing overlay", base, "qcow2", existing, 0, []string{"already exists", "refusing to overwrite"}},
		{"smaller than base", base, "qcow2", filepath.Join(dir, "small.qcow2"), 32 << 20, []string{"smaller than the base"}},
		{"unaligned size", base, "qcow2", filepath.Join(dir, "odd.qcow2"), 64<<20 + 1, []string{"not a multiple of 512"}},
		{"wrong format", base, "raw", filepath.Join(dir, "wrong.qcow2"), 0, []string{"is qcow2, not raw"}},
		{"missing base", filepath.Join(dir, "nope.qcow2"), "qcow2", filepath.Join(dir, "ov.qcow2"), 0, []string{"nope.qcow2", "does not exist"}},
		{"missing directory", base, "qcow2", filepath.Join(dir, "no", "such", "ov.qcow2"), 0, []string{"does not exist"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CreateOverlay(ctx, execx.OS{}, tc.base, tc.format, tc.overlay, tc.size)
			wantErr(t, err, tc.want...)
			if tc.overlay != existing {
				if _, err := os.Stat(tc.overlay); err == nil {
					t.Errorf("%s was created", tc.overlay)
				}
			}
		})
	}
	if b, _ := os.ReadFile(existing); !bytes.Equal(b, []byte("a VM's precious disk")) {
		t.Errorf("existing overlay was changed: %q", b)
	}
	if left := tempLeftovers(t, dir); len(left) > 0 {
		t.Errorf("temporary files left: %q", left)
	}
}

func TestCreateOverlayFailureLeavesNothing(t *testing.T) {
	// FAKE runner at the exec boundary: qemu-img info answers for the base,
	// qemu-img create fails half way, leaving a file behind as a real
	// failure might.
	dir := t.TempDir()
	base := writeFile(t, filepath.Join(dir, "base.raw"), 2<<20, map[int]string{510: "\x55\xaa"})
	ov := filepath.Join(dir, "vm.qcow2")
	fake := execxtest.New(t).On("qemu-img", func(c execxtest.Call) execxtest.Reply {
		switch c.Args[0] {
		case "info":
			return execxtest.Reply{Stdout: `{"format":"raw","virtual-size":2097152,"actual-size":4096}`}
		case "create":
			_ = os.WriteFile(c.Args[len(c.Args)-2], []byte("half"), 0o644)
			return execxtest.Reply{ExitCode: 1, Stderr: "qemu-img: disk full"}
		}
		t.Errorf("unexpected qemu-img %q", c.Args)
		return execxtest.Reply{ExitCode: 1}
	})
	err := CreateOverlay(context.Background(), fake, base, "raw", ov, 0)
	wantErr(t, err, "creating overlay", "disk full")
	if _, err := os.Stat(ov); err == nil {
		t.Error("overlay exists after a failed create")
	}
	if left := tempLeftovers(t, dir); len(left) > 0 {
		t.Errorf("temporary files left: %q", left)
	}
	calls := fake.Calls()
	create := calls[len(calls)-1]
	wantArgs := []string{"create", "-q", "-f", "qcow2", "-F", "raw", "-b", base}
	if strings.Join(create.Args[:len(wantArgs)], " ") != strings.Join(wantArgs, " ") || create.Args[len(create.Args)-1] != "2097152" {
		t.Errorf("qemu-img args: got %q, want %q + temp path + size 2097152", create.Args, wantArgs)
	}
}

func TestCopyOverlay(t *testing.T) {
	testutil.Program(t, "qemu-img")
	testutil.Program(t, "qemu-io")
	ctx := context.Background()
	dir := t.TempDir()
	base := makeQcow2(t, dir, "base.qcow2", 64<<20)
	from := filepath.Join(dir, "from.qcow2")
	if err := CreateOverlay(ctx, execx.OS{}, base, "qcow2", from, 1<<30); err != nil {
		t.Fatal(err)
	}
	// Data at both ends of the disk, a hole between.
	run(t, "qemu-io", "-f", "qcow2", "-c", "write -P 0xab 0 1M", "-c", "write -P 0xcd 1020M 1M", from)

	to := filepath.Join(dir, "to.qcow2")
	n, err := CopyOverlay(ctx, execx.OS{}, from, to, true)
	if err != nil {
		t.Fatal(err)
	}
	if n <= 2<<20 || n > 16<<20 {
		t.Errorf("copied %d bytes; the overlay holds 2 MiB of data and its tables", n)
	}
	if got := qemuInfoJSON(t, to).Get("backing-filename").String(); got != base {
		t.Errorf("the copy's backing file: %q, want %q", got, base)
	}
	run(t, "qemu-img", "compare", "-f", "qcow2", "-F", "qcow2", from, to) // exits 1 when they differ
	if fi, err := os.Stat(to); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the copy: %v, %v; want mode 0600", fi, err)
	}
	// The two diverge from here.
	run(t, "qemu-io", "-f", "qcow2", "-c", "write -P 0xee 0 1M", to)
	if out := run(t, "qemu-io", "-f", "qcow2", "-c", "read -P 0xab 0 1M", from); strings.Contains(out, "Pattern verification failed") {
		t.Errorf("a write to the copy changed the source: %s", out)
	}
	if left := tempLeftovers(t, dir); len(left) > 0 {
		t.Errorf("temporary files left: %q", left)
	}

	t.Run("refuses an existing destination", func(t *testing.T) {
		if _, err := CopyOverlay(ctx, execx.OS{}, from, to, true); err == nil || !strings.Contains(err.Error(), "already exists") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("refuses a disk that is no overlay, leaving nothing", func(t *testing.T) {
		raw := writeFile(t, filepath.Join(dir, "disk.raw"), 1<<20, map[int]string{510: "\x55\xaa"})
		dst := filepath.Join(dir, "raw-copy.qcow2")
		if _, err := CopyOverlay(ctx, execx.OS{}, raw, dst, true); err == nil || !strings.Contains(err.Error(), "not a qcow2 overlay") {
			t.Fatalf("got %v", err)
		}
		if _, err := os.Lstat(dst); !os.IsNotExist(err) {
			t.Errorf("%s was made: %v", dst, err)
		}
	})
	t.Run("an interrupt leaves nothing", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		dst := filepath.Join(dir, "cancelled.qcow2")
		if _, err := CopyOverlay(cctx, execx.OS{}, from, dst, true); err == nil {
			t.Fatal("a cancelled copy succeeded")
		}
		if _, err := os.Lstat(dst); !os.IsNotExist(err) {
			t.Errorf("%s was made: %v", dst, err)
		}
		if left := tempLeftovers(t, dir); len(left) > 0 {
			t.Errorf("temporary files left: %q", left)
		}
	})
}
