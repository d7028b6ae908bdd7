package image

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/agent-vm/agent-vm/internal/execx"
)

// checkRootfs verifies the tree mmdebstrap made (kernel, initrd, modules,
// packages, no host keys) and returns the manifest fields it yields.
func (b *builder) checkRootfs(ctx context.Context, rootfs string) (*Manifest, error) {
	kver, err := kernelVersion(rootfs)
	if err != nil {
		return nil, err
	}
	modules, err := checkModules(rootfs, kver, requiredModules())
	if err != nil {
		return nil, err
	}
	if err := b.checkInitrd(ctx, rootfs, kver); err != nil {
		return nil, err
	}
	pkgs, err := b.installedPackages(ctx, rootfs)
	if err != nil {
		return nil, err
	}
	if err := checkPackages(pkgs, guestPackages(b.arch)); err != nil {
		return nil, err
	}
	keys, _ := filepath.Glob(filepath.Join(rootfs, "etc", "ssh", "ssh_host_*"))
	if len(keys) > 0 {
		return nil, fmt.Errorf("the root filesystem still has SSH host keys (%s): every VM must get its own", filepath.Base(keys[0]))
	}
	return &Manifest{
		Schema:         manifestSchema,
		Name:           b.opts.Name,
		Kind:           KindBuilt,
		BuilderVersion: BuilderVersion,
		Created:        b.now().UTC().Round(0),
		Arch:           b.arch.deb,
		Kernel:         KernelFile,
		Initrd:         InitrdFile,
		KernelVersion:  kver,
		Cmdline:        kernelCmdline(b.arch),
		Release:        b.opts.Release,
		Mirror:         b.opts.Mirror,
		SecurityMirror: b.opts.SecurityMirror,
		Sources:        aptSources(b.opts),
		Modules:        modules,
		Packages:       pkgs,
	}, nil
}

// kernelVersion finds the one kernel in /boot and checks its initrd is there.
func kernelVersion(rootfs string) (string, error) {
	kernels, err := filepath.Glob(filepath.Join(rootfs, "boot", "vmlinuz-*"))
	if err != nil {
		return "", err
	}
	if len(kernels) != 1 {
		return "", fmt.Errorf("the root filesystem has %d kernels in /boot, want exactly one", len(kernels))
	}
	kver := strings.TrimPrefix(filepath.Base(kernels[0]), "vmlinuz-")
	if _, err := os.Stat(filepath.Join(rootfs, "boot", "initrd.img-"+kver)); err != nil {
		return "", fmt.Errorf("the root filesystem has no initrd for kernel %s: %w", kver, err)
	}
	return kver, nil
}

// kernelModules lists the module names (with '-' as '_') that a kernel in
// rootfs has, as loadable modules and built in.
func kernelModules(rootfs, kver string) (loadable, builtin map[string]bool, err error) {
	dir := filepath.Join(rootfs, "usr", "lib", "modules", kver)
	if _, err := os.Stat(dir); err != nil {
		dir = filepath.Join(rootfs, "lib", "modules", kver)
	}
	loadable, err = moduleNames(filepath.Join(dir, "modules.dep"), true)
	if err != nil {
		return nil, nil, err
	}
	builtin, err = moduleNames(filepath.Join(dir, "modules.builtin"), false)
	return loadable, builtin, err
}

// moduleNames reads modules.dep ("path: deps") or modules.builtin ("path").
func moduleNames(path string, dep bool) (map[string]bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading the kernel's module list: %w", err)
	}
	defer f.Close()
	names := map[string]bool{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if dep {
			line, _, _ = strings.Cut(line, ":")
		}
		if line = strings.TrimSpace(line); line != "" {
			names[moduleName(line)] = true
		}
	}
	return names, sc.Err()
}

// moduleName turns "kernel/fs/fuse/virtiofs.ko.xz" into "virtiofs".
func moduleName(path string) string {
	base := filepath.Base(path)
	if i := strings.Index(base, ".ko"); i >= 0 {
		base = base[:i]
	}
	return strings.ReplaceAll(base, "-", "_")
}

// checkModules returns want, each marked "(built in)" when it is, or an
// error naming the modules the kernel lacks.
func checkModules(rootfs, kver string, want []string) ([]string, error) {
	loadable, builtin, err := kernelModules(rootfs, kver)
	if err != nil {
		return nil, err
	}
	var found, missing []string
	for _, m := range want {
		switch {
		case loadable[m]:
			found = append(found, m)
		case builtin[m]:
			found = append(found, m+" (built in)")
		default:
			missing = append(missing, m)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("kernel %s lacks the modules %s, which agent-vm's VMs need", kver, strings.Join(missing, ", "))
	}
	return found, nil
}

// checkInitrd makes sure the small initrd really carries what mounts the root.
func (b *builder) checkInitrd(ctx context.Context, rootfs, kver string) error {
	res, err := b.opts.Runner.Run(ctx, execx.Cmd{Path: "chroot", Args: []string{rootfs, "lsinitramfs", "/boot/initrd.img-" + kver}})
	if err != nil {
		return fmt.Errorf("listing the initrd: %w", err)
	}
	in := map[string]bool{}
	for _, line := range strings.Split(string(res.Stdout), "\n") {
		if strings.Contains(line, ".ko") {
			in[moduleName(line)] = true
		}
	}
	_, builtin, err := kernelModules(rootfs, kver)
	if err != nil {
		return err
	}
	var missing []string
	for _, m := range initrdModules() {
		if !in[m] && !builtin[m] {
			missing = append(missing, m)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("the initrd for %s lacks %s, so it could not mount the root disk", kver, strings.Join(missing, ", "))
	}
	return nil
}

// installedPackages asks dpkg in the root filesystem what is installed.
func (b *builder) installedPackages(ctx context.Context, rootfs string) ([]Package, error) {
	res, err := b.opts.Runner.Run(ctx, execx.Cmd{Path: "chroot", Args: []string{rootfs, "dpkg-query", "--show",
		"--showformat=${db:Status-Abbrev}\t${Package}\t${Version}\t${Architecture}\n"}})
	if err != nil {
		return nil, fmt.Errorf("listing the installed packages: %w", err)
	}
	return parsePackages(string(res.Stdout))
}

func parsePackages(out string) ([]Package, error) {
	var pkgs []Package
	for _, line := range strings.Split(out, "\n") {
		f := strings.Split(line, "\t")
		if len(f) != 4 || !strings.HasPrefix(f[0], "ii") {
			continue
		}
		pkgs = append(pkgs, Package{Name: f[1], Version: f[2], Arch: f[3]})
	}
	if len(pkgs) == 0 {
		return nil, errors.New("dpkg lists no installed packages in the root filesystem")
	}
	sort.Slice(pkgs, func(i, j int) bool { return pkgs[i].Name < pkgs[j].Name })
	return pkgs, nil
}

func checkPackages(have []Package, want []string) error {
	installed := map[string]bool{}
	for _, p := range have {
		installed[p.Name] = true
	}
	var missing []string
	for _, w := range want {
		if !installed[w] {
			missing = append(missing, w)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("the root filesystem lacks the packages %s", strings.Join(missing, ", "))
	}
	return nil
}

// treeUsage estimates the space a tree takes on ext4: allocated blocks of
// files, a block per directory and an inode per entry.
func treeUsage(root string) (int64, error) {
	var total int64
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		total += 256 // inode
		if d.IsDir() {
			total += 4096
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && fi.Mode().IsRegular() {
			total += int64(st.Blocks) * 512
		}
		return nil
	})
	return total, err
}
