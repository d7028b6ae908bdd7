package vagrantbox

import (
	"context"
	_ "embed"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/image"
	"github.com/agent-vm/agent-vm/internal/termsafe"
)

// Provider is the only provider the box is made for.
const Provider = "libvirt"

// Names of the files in a box.
const (
	DiskFile     = "box.img"
	MetadataFile = "metadata.json"
	VagrantFile  = "Vagrantfile"
	// ParamsFile is the JSON the box's Vagrantfile reads.
	ParamsFile = "agent-vm-box.json"
)

// The box's Vagrantfile. Not named Vagrantfile here: vagrant loads the
// Vagrantfile of its working directory on every command.
//
//go:embed box_vagrantfile.rb
var boxVagrantfile []byte

// Box names a box in vagrant's terms.
type Box struct {
	Name    string // agent-vm/<image name>
	Version string // see the package doc
	// Cmdline is the kernel command line the box boots its kernel with
	// (the image's), "" for an image without a kernel beside its disk.
	Cmdline string
}

// String is how vagrant prints it.
func (b Box) String() string { return fmt.Sprintf("%s (%s, %s)", b.Name, Provider, b.Version) }

// dirName is the box's directory name under VAGRANT_HOME/boxes.
func (b Box) dirName() string { return strings.ReplaceAll(b.Name, "/", "-VAGRANTSLASH-") }

// Dir is where vagrant keeps the added box under home.
func (b Box) Dir(home string) string {
	return filepath.Join(home, "boxes", b.dirName(), b.Version, Provider)
}

// PoolVolume is the libvirt storage volume vagrant-libvirt uploads box.img
// to on the first `vagrant up` (in the pool "default" unless the Vagrantfile
// names another). Nobody deletes it but `virsh vol-delete`.
func (b Box) PoolVolume() string {
	return b.dirName() + "_vagrant_box_image_" + b.Version + "_box.img"
}

// params is agent-vm-box.json.
type params struct {
	Kernel  string `json:"kernel,omitempty"`
	Initrd  string `json:"initrd,omitempty"`
	Cmdline string `json:"cmdline,omitempty"`
	// Image and SHA256 say which image the box was made from.
	Image  string `json:"image"`
	SHA256 string `json:"sha256"`
}

// metadata is the box's metadata.json.
type metadata struct {
	Provider    string `json:"provider"`
	Format      string `json:"format"`
	VirtualSize int64  `json:"virtual_size"` // GiB, rounded up
}

// For returns the box an image makes, or why it makes none.
func For(img *image.Image) (Box, error) {
	m := img.Manifest
	if img.Format != "qcow2" {
		return Box{}, fmt.Errorf("image %q is %s, and a vagrant-libvirt box must be qcow2 (hint: rebuild it with `agent-vm image build`)", img.Name, img.Format)
	}
	sum, err := hex.DecodeString(m.SHA256)
	if err != nil || len(sum) < 4 {
		return Box{}, fmt.Errorf("image %q: manifest sha256 %q is not a hex digest (hint: rebuild or re-pull it)", img.Name, m.SHA256)
	}
	if m.Created.IsZero() {
		return Box{}, fmt.Errorf("image %q: manifest has no creation time (hint: rebuild or re-pull it)", img.Name)
	}
	b := Box{
		Name:    "agent-vm/" + img.Name,
		Version: fmt.Sprintf("%d.%d", m.Created.Unix(), binary.BigEndian.Uint32(sum)),
	}
	if img.Kernel != "" {
		b.Cmdline = img.Cmdline
	}
	return b, nil
}

// Write writes the box file for img to path (an uncompressed tar, mode
// 0644: it holds no secret) and returns its sha256.
func Write(ctx context.Context, img *image.Image, path string) (string, error) {
	box, err := For(img)
	if err != nil {
		return "", err
	}
	entries, err := boxEntries(img, box)
	if err != nil {
		return "", err
	}
	sum, err := writeTar(ctx, path, entries, img.Manifest.Created)
	if err != nil {
		return "", fmt.Errorf("writing the box for image %q to %s: %w", img.Name, path, err)
	}
	return sum, nil
}

// boxEntries lists the files of img's box, the disk last (the rest are
// small, so a reader finds them early).
func boxEntries(img *image.Image, box Box) ([]entry, error) {
	m := img.Manifest
	meta, err := json.Marshal(metadata{Provider: Provider, Format: "qcow2", VirtualSize: (m.VirtualSizeBytes + 1<<30 - 1) >> 30})
	if err != nil {
		return nil, err
	}
	p := params{Image: img.Name, SHA256: m.SHA256}
	var files []entry
	if img.Kernel != "" {
		p.Kernel, p.Cmdline = image.KernelFile, box.Cmdline
		files = append(files, entry{name: image.KernelFile, source: img.Kernel})
		if img.Initrd != "" {
			p.Initrd = image.InitrdFile
			files = append(files, entry{name: image.InitrdFile, source: img.Initrd})
		}
	}
	pj, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return nil, err
	}
	out := []entry{
		{name: MetadataFile, data: append(meta, '\n')},
		{name: VagrantFile, data: boxVagrantfile},
		{name: ParamsFile, data: append(pj, '\n')},
	}
	out = append(out, files...)
	return append(out, entry{name: DiskFile, source: img.Disk}), nil
}

// CheckQEMUCanRead says whether a QEMU running as another user (libvirt's
// qemu:///system runs it as libvirt-qemu) can open path: every directory
// above it searchable by others. libvirt chowns the file itself, never its
// directories. The error names the first directory that stops it and the fix.
func CheckQEMUCanRead(path string) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	for dir := filepath.Dir(abs); ; dir = filepath.Dir(dir) {
		fi, err := os.Stat(dir)
		if err != nil {
			return fmt.Errorf("checking that libvirt's QEMU can reach %s: %w", path, err)
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("libvirt's QEMU (user libvirt-qemu under qemu:///system) cannot reach %s: directory %s has mode %04o, not searchable by others (hint: put VAGRANT_HOME and the VM's files outside home directories, or `chmod o+x %s`)",
				path, dir, fi.Mode().Perm(), dir)
		}
		if dir == filepath.Dir(dir) {
			return nil
		}
	}
}

// catalog is vagrant's box metadata format, the one way to add a local box
// with a version.
type catalog struct {
	Name     string           `json:"name"`
	Versions []catalogVersion `json:"versions"`
}

type catalogVersion struct {
	Version   string            `json:"version"`
	Providers []catalogProvider `json:"providers"`
}

type catalogProvider struct {
	Name         string `json:"name"`
	URL          string `json:"url"`
	ChecksumType string `json:"checksum_type"`
	Checksum     string `json:"checksum"`
}

// AddOptions says where to add the box.
type AddOptions struct {
	Run execx.Runner
	// Vagrant is vagrant's path; empty means "vagrant".
	Vagrant string
	// Home is the VAGRANT_HOME to add the box to.
	Home string
	// WorkDir holds the box file and catalog while vagrant adds them (it
	// needs room for a copy of the disk); they are removed afterwards.
	WorkDir string
	// Progress, when set, receives vagrant's output.
	Progress io.Writer
}

// Add adds img's box to o.Home unless it is there already, and returns it.
func Add(ctx context.Context, img *image.Image, o AddOptions) (Box, error) {
	box, err := For(img)
	if err != nil {
		return Box{}, err
	}
	if o.Home == "" || o.WorkDir == "" {
		return Box{}, errors.New("adding a vagrant box: VAGRANT_HOME and a work directory are required")
	}
	if _, err := os.Stat(filepath.Join(box.Dir(o.Home), MetadataFile)); err == nil {
		return box, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return Box{}, fmt.Errorf("looking for box %s in %s: %w", box, o.Home, err)
	}
	work, err := os.MkdirTemp(o.WorkDir, "vagrantbox-")
	if err != nil {
		return Box{}, fmt.Errorf("making room for the box of image %q: %w (hint: WorkDir must be a writable directory with space for the disk, %d bytes)", img.Name, err, img.Manifest.SizeBytes)
	}
	defer os.RemoveAll(work)
	boxFile := filepath.Join(work, "box.box")
	sum, err := Write(ctx, img, boxFile)
	if err != nil {
		return Box{}, err
	}
	cat, err := json.Marshal(catalog{Name: box.Name, Versions: []catalogVersion{{
		Version: box.Version,
		Providers: []catalogProvider{{Name: Provider, URL: (&url.URL{Scheme: "file", Path: boxFile}).String(),
			ChecksumType: "sha256", Checksum: sum}},
	}}})
	if err != nil {
		return Box{}, err
	}
	catFile := filepath.Join(work, "catalog.json")
	if err := os.WriteFile(catFile, cat, 0o644); err != nil {
		return Box{}, fmt.Errorf("writing the box catalog: %w", err)
	}
	vagrant := o.Vagrant
	if vagrant == "" {
		vagrant = "vagrant"
	}
	// Every vagrant command loads the Vagrantfile of its working directory
	// (or VAGRANT_CWD) and its parents: run it where there is none.
	var out io.Writer // vagrant's \r progress, collapsed
	if o.Progress != nil {
		lines := termsafe.NewLineWriter(o.Progress)
		defer lines.Close()
		out = lines
	}
	_, err = o.Run.Run(ctx, execx.Cmd{Path: vagrant, Args: []string{"box", "add", "--provider", Provider, catFile},
		Dir: work, Env: append(Env(o.Home), "VAGRANT_CWD="+work), Stdout: out, Stderr: out})
	if err != nil {
		return Box{}, fmt.Errorf("adding box %s to VAGRANT_HOME %s: %w (hint: vagrant's message says why; a missing provider means vagrant-libvirt is not installed: `sudo agent-vm setup --backend vagrant`)", box, o.Home, err)
	}
	return box, nil
}

// Env is the environment agent-vm runs vagrant with for home: its own
// VAGRANT_HOME, and no calls home (HashiCorp's version checkpoint, box
// update checks).
func Env(home string) []string {
	return []string{"VAGRANT_HOME=" + home, "VAGRANT_CHECKPOINT_DISABLE=1", "VAGRANT_BOX_UPDATE_CHECK_DISABLE=1"}
}
