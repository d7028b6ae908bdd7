package vagrantbox

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/execx/execxtest"
	"github.com/agent-vm/agent-vm/internal/image"
	"github.com/agent-vm/agent-vm/internal/testutil"
)

// smallImage is a built image with tiny files standing in for the disk and
// kernel.
func smallImage(t *testing.T) *image.Image {
	t.Helper()
	dir := t.TempDir()
	for name, content := range map[string]string{"disk.qcow2": "QFI\xfbdisk", image.KernelFile: "kernel", image.InitrdFile: "initrd"} {
		testutil.WriteFile(t, filepath.Join(dir, name), content)
	}
	return &image.Image{
		Name: "debian-bookworm", Dir: dir, Disk: filepath.Join(dir, "disk.qcow2"), Format: "qcow2",
		Kernel: filepath.Join(dir, image.KernelFile), Initrd: filepath.Join(dir, image.InitrdFile),
		Cmdline: "root=/dev/vda rw console=ttyS0,115200",
		Manifest: image.Manifest{Name: "debian-bookworm", Created: time.Date(2026, 11, 23, 12, 34, 48, 0, time.UTC),
			SHA256: "36a3fc8e2c925337c076bb8d8826b4a3354e52d8187c3ae1c14ba3d2f1535da6", VirtualSizeBytes: 4<<30 + 1},
	}
}

func TestBoxIdentityComesFromTheManifest(t *testing.T) {
	img := smallImage(t)
	box, err := For(img)
	if err != nil {
		t.Fatal(err)
	}
	// 0x36a3fc8e = 916716686
	if box.Name != "agent-vm/debian-bookworm" || box.Version != "1795437288.916716686" {
		t.Errorf("got %q %q", box.Name, box.Version)
	}
	if got, want := box.PoolVolume(), "agent-vm-VAGRANTSLASH-debian-bookworm_vagrant_box_image_1795437288.916716686_box.img"; got != want {
		t.Errorf("pool volume %q, want %q", got, want)
	}
	for _, tc := range []struct {
		name   string
		change func(*image.Image)
		want   string
	}{
		{"raw disk", func(i *image.Image) { i.Format = "raw" }, "must be qcow2"},
		{"bad digest", func(i *image.Image) { i.Manifest.SHA256 = "zz" }, "not a hex digest"},
		{"no time", func(i *image.Image) { i.Manifest.Created = time.Time{} }, "no creation time"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := *img
			tc.change(&bad)
			_, err := For(&bad)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), `"debian-bookworm"`) || !strings.Contains(err.Error(), "hint:") {
				t.Errorf("got %v, want an error naming the image, saying %q, with a hint", err, tc.want)
			}
		})
	}
}

func TestWriteMakesAVagrantLibvirtBox(t *testing.T) {
	img := smallImage(t)
	path := filepath.Join(t.TempDir(), "x.box")
	sum, err := Write(context.Background(), img, path)
	if err != nil {
		t.Fatal(err)
	}
	if len(sum) != 64 {
		t.Errorf("sha256 %q", sum)
	}
	files := readTar(t, path)
	var names []string
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	if want := []string{VagrantFile, ParamsFile, DiskFile, image.InitrdFile, MetadataFile, image.KernelFile}; !slices.Equal(names, want) {
		t.Errorf("box holds %q, want %q", names, want)
	}
	if got := files[MetadataFile]; got != `{"provider":"libvirt","format":"qcow2","virtual_size":5}`+"\n" {
		t.Errorf("metadata.json %q (virtual_size is GiB, rounded up)", got)
	}
	var p params
	if err := json.Unmarshal([]byte(files[ParamsFile]), &p); err != nil {
		t.Fatal(err)
	}
	if p != (params{Kernel: "vmlinuz", Initrd: "initrd.img", Cmdline: img.Cmdline, Image: "debian-bookworm", SHA256: img.Manifest.SHA256}) {
		t.Errorf("params %+v", p)
	}
	if files[DiskFile] != "QFI\xfbdisk" || files[image.KernelFile] != "kernel" {
		t.Error("the disk or kernel is not the image's")
	}
	if !strings.Contains(files[VagrantFile], "libvirt.cmd_line = box[\"cmdline\"]") {
		t.Errorf("the Vagrantfile does not set cmd_line from the JSON:\n%s", files[VagrantFile])
	}
	// The same image gives the same bytes.
	again, err := Write(context.Background(), img, path+".2")
	if err != nil || again != sum {
		t.Errorf("second write: %s, %v; want %s", again, err, sum)
	}
}

func TestWriteNamesAMissingImageFile(t *testing.T) {
	img := smallImage(t)
	os.Remove(img.Kernel)
	_, err := Write(context.Background(), img, filepath.Join(t.TempDir(), "x.box"))
	if err == nil || !strings.Contains(err.Error(), "vmlinuz") || !strings.Contains(err.Error(), "agent-vm image build") {
		t.Errorf("got %v, want an error naming vmlinuz and the rebuild", err)
	}
}

func readTar(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]string{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if h.Mode != 0o644 {
			t.Errorf("%s: mode %o", h.Name, h.Mode)
		}
		out[h.Name] = string(b)
	}
}

// FAKE at the exec boundary: vagrant box add is recorded, not run. Add
// hands vagrant a catalog naming the box file by file:// URL with its
// checksum, in an environment of its own, away from any Vagrantfile; and
// adds nothing when the box is there.
func TestAddHandsVagrantACatalog(t *testing.T) {
	img := smallImage(t)
	home, work := t.TempDir(), t.TempDir()
	box, _ := For(img)
	f := execxtest.New(t).On("vagrant", func(c execxtest.Call) execxtest.Reply {
		cat := c.Args[len(c.Args)-1]
		if !slices.Equal(c.Args[:len(c.Args)-1], []string{"box", "add", "--provider", "libvirt"}) {
			t.Errorf("vagrant %q", c.Args)
		}
		b, err := os.ReadFile(cat)
		if err != nil {
			t.Fatal(err)
		}
		var got catalog
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		p := got.Versions[0].Providers[0]
		if got.Name != box.Name || got.Versions[0].Version != box.Version || p.Name != "libvirt" || p.ChecksumType != "sha256" ||
			!strings.HasPrefix(p.URL, "file://"+work+"/") {
			t.Errorf("catalog %s", b)
		}
		if _, err := os.Stat(strings.TrimPrefix(p.URL, "file://")); err != nil {
			t.Errorf("the box file is not there while vagrant runs: %v", err)
		}
		for _, e := range []string{"VAGRANT_HOME=" + home, "VAGRANT_CHECKPOINT_DISABLE=1", "VAGRANT_CWD=" + c.Dir} {
			if !slices.Contains(c.Env, e) {
				t.Errorf("env %q lacks %q", c.Env, e)
			}
		}
		testutil.WriteFile(t, filepath.Join(box.Dir(home), MetadataFile), "{}") // what vagrant does
		return execxtest.Reply{}
	})
	got, err := Add(context.Background(), img, AddOptions{Run: f, Home: home, WorkDir: work})
	if err != nil || got != box {
		t.Fatalf("Add: %v, %v", got, err)
	}
	if left, _ := os.ReadDir(work); len(left) != 0 {
		t.Errorf("work dir keeps %d entries; the box file must be removed", len(left))
	}
	if _, err := Add(context.Background(), img, AddOptions{Run: f, Home: home, WorkDir: work}); err != nil {
		t.Fatal(err)
	}
	if n := len(f.Calls()); n != 1 {
		t.Errorf("%d vagrant calls, want 1: the second Add finds the box", n)
	}
}

// FAKE at the exec boundary: vagrant fails; the error names the box, the
// VAGRANT_HOME, vagrant's message and the fix.
func TestAddReportsVagrantsFailure(t *testing.T) {
	f := execxtest.New(t).On("vagrant", func(execxtest.Call) execxtest.Reply {
		return execxtest.Reply{ExitCode: 1, Stderr: "The provider 'libvirt' could not be found"}
	})
	home := t.TempDir()
	_, err := Add(context.Background(), smallImage(t), AddOptions{Run: f, Home: home, WorkDir: t.TempDir()})
	for _, want := range []string{"agent-vm/debian-bookworm", home, "could not be found", "agent-vm setup --backend vagrant"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not say %q", err, want)
		}
	}
}

func TestCheckQEMUCanRead(t *testing.T) {
	base := t.TempDir() // 0700
	file := filepath.Join(base, "a", "vmlinuz")
	testutil.WriteFile(t, file, "k")
	err := CheckQEMUCanRead(file)
	if err == nil || !strings.Contains(err.Error(), "has mode 0700") || !strings.Contains(err.Error(), "hint:") {
		t.Errorf("under a 0700 directory: %v", err)
	}
	for _, d := range []string{filepath.Dir(base), base} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	if err := CheckQEMUCanRead(file); err != nil {
		t.Errorf("all directories searchable: %v", err)
	}
}
