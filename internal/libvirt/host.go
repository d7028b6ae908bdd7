package libvirt

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/libvirtnet"
	"github.com/agent-vm/agent-vm/internal/virtpool"
)

// Host is one libvirt host as the driver uses it, the same whether it is
// this machine or another reached over agent-vm's link
// (internal/hostlink): libvirt's API, programs run there (virsh and nft,
// for the VM's network), and agent-vm's storage pool there.
type Host struct {
	L *golibvirt.Libvirt
	// Run runs programs on the host: execx.OS here, hostlink.Runner there.
	Run execx.Runner
	// URI is the host's libvirt as virsh on the host reaches it
	// (qemu:///system).
	URI  string
	Pool virtpool.Pool
}

// Image is the base image a VM's root disk is an overlay of: local files,
// uploaded to the host's pool once per Version.
type Image struct {
	// Version names the image's volumes on the host (its name and build
	// time, say), so a new image is a new set of volumes.
	Version              string
	Disk, Kernel, Initrd string // local paths
	Format               string // the disk's: "qcow2"
	Cmdline              string
}

// Machine is what Up boots.
type Machine struct {
	Name, UUID string
	Type       string // "kvm" or "qemu"
	CPUs       int
	MemoryMiB  int
	DiskBytes  uint64 // the root overlay's size
	MAC        string
	// ProxyAddr is where the guest reaches its proxy and exposed ports
	// (guest.HostAddr), routed to the host by the VM's network.
	ProxyAddr netip.Addr
	// Console is the file on the host the serial console goes to.
	Console string
	Share   *Share
	FwCfg   []FwCfg
}

// Volume names of a VM's own on the host.
func rootVol(name string) string { return name + "-root.qcow2" }
func seedVol(name string) string { return name + "-seed.iso" }

// Running is a machine Up started.
type Running struct {
	Net libvirtnet.Net
}

// upload is the base image's volumes on the host, sent once.
func (h Host) upload(img Image) (disk, kernel, initrd virtpool.Vol, err error) {
	put := func(path, suffix, format string) (virtpool.Vol, error) {
		if path == "" {
			// Staged: uploaded by the driver on the other side of the
			// link before this start (see hostside.go).
			v, _, err := h.Pool.Base(img.Version+"-"+suffix, format, 0, func() (io.ReadCloser, error) {
				return nil, fmt.Errorf("the base image's %s (version %s) is not in the host's pool (hint: start the VM again: agent-vm uploads it first)", suffix, img.Version)
			})
			return v, err
		}
		fi, err := os.Stat(path)
		if err != nil {
			return virtpool.Vol{}, fmt.Errorf("the base image's %s: %w", suffix, err)
		}
		v, _, err := h.Pool.Base(img.Version+"-"+suffix, format, fi.Size(), func() (io.ReadCloser, error) { return os.Open(path) })
		return v, err
	}
	if disk, err = put(img.Disk, "disk."+img.Format, img.Format); err != nil {
		return
	}
	if kernel, err = put(img.Kernel, "vmlinuz", "raw"); err != nil {
		return
	}
	initrd, err = put(img.Initrd, "initrd.img", "raw")
	return
}

// Up makes m's disks, network and domain on the host and starts it: the
// base image's volumes (once per version), the root overlay (once per
// VM: its disk), the seed (every start), the VM's isolated network
// (libvirtnet), and the domain defined afresh from its XML. A domain of
// that name that runs is an error. On failure the domain is not left
// running; the volumes and the network stay for Remove.
func (h Host) Up(ctx context.Context, m Machine, img Image, seed []byte) (Running, error) {
	if st, _, err := h.State(m.Name); err != nil {
		return Running{}, err
	} else if st == golibvirt.DomainRunning || st == golibvirt.DomainPaused {
		return Running{}, fmt.Errorf("the libvirt domain %s already runs on the host", m.Name)
	}
	if _, err := h.Pool.Ensure(); err != nil {
		return Running{}, err
	}
	disk, kernel, initrd, err := h.upload(img)
	if err != nil {
		return Running{}, err
	}
	root, err := h.Pool.Find(rootVol(m.Name))
	if err != nil {
		return Running{}, err
	}
	if root == nil {
		v, err := h.Pool.Overlay(rootVol(m.Name), disk, m.DiskBytes)
		if err != nil {
			return Running{}, err
		}
		root = &v
	}
	sv, err := h.Pool.Put(seedVol(m.Name), seed)
	if err != nil {
		return Running{}, err
	}
	ln := libvirtnet.Libvirt{Run: h.Run, URI: h.URI}
	id := libvirtnet.ID(m.UUID)
	net, err := ln.Up(ctx, m.Name, func(i int) libvirtnet.Net { return libvirtnet.Candidate(m.Name, id, m.MAC, m.ProxyAddr, i) })
	if err != nil {
		return Running{}, err
	}
	x, err := Domain{Name: m.Name, UUID: m.UUID, Type: m.Type, CPUs: m.CPUs, MemoryMiB: m.MemoryMiB, Machine: "q35",
		Kernel: kernel.Path, Initrd: initrd.Path, Cmdline: img.Cmdline,
		Disks:   []Disk{{Path: root.Path, Format: "qcow2"}, {Path: sv.Path, Format: "raw", ReadOnly: true}},
		Network: net.Name, MAC: m.MAC, Share: m.Share, FwCfg: m.FwCfg, Console: m.Console}.XML()
	if err != nil {
		return Running{}, err
	}
	d, err := h.L.DomainDefineXML(x)
	if err != nil {
		return Running{}, fmt.Errorf("defining the libvirt domain %s: %w", m.Name, err)
	}
	if err := h.L.DomainCreate(d); err != nil {
		return Running{}, fmt.Errorf("starting the libvirt domain %s: %w (hint: the host's libvirtd log, or the console log %s, says why)", m.Name, err, m.Console)
	}
	return Running{Net: net}, nil
}

// State is libvirt's state of the domain name and its reason;
// DomainNostate with no error when there is no such domain.
func (h Host) State(name string) (golibvirt.DomainState, int32, error) {
	d, err := h.L.DomainLookupByName(name)
	if golibvirt.IsNotFound(err) {
		return golibvirt.DomainNostate, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("looking up the libvirt domain %s: %w", name, err)
	}
	st, reason, err := h.L.DomainGetState(d, 0)
	if err != nil {
		return 0, 0, fmt.Errorf("reading the state of the libvirt domain %s: %w", name, err)
	}
	return golibvirt.DomainState(st), reason, nil
}

// Shutdown asks the guest to power off (ACPI) and waits for it, up to
// grace; then, or when ctx ends, it forces the domain off. A domain that
// does not run is nothing to do.
func (h Host) Shutdown(ctx context.Context, name string, grace time.Duration) error {
	d, err := h.L.DomainLookupByName(name)
	if golibvirt.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if st, _, err := h.State(name); err != nil || (st != golibvirt.DomainRunning && st != golibvirt.DomainPaused) {
		return err
	}
	if err := h.L.DomainShutdown(d); err == nil {
		deadline := time.Now().Add(grace)
		for time.Now().Before(deadline) && ctx.Err() == nil {
			if st, _, err := h.State(name); err == nil && st == golibvirt.DomainShutoff {
				return nil
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	if err := h.L.DomainDestroy(d); err != nil && !strings.Contains(err.Error(), "not running") {
		return fmt.Errorf("forcing the libvirt domain %s off: %w", name, err)
	}
	return nil
}

// Remove forces the domain off, undefines it and deletes what Up made of
// the VM's: its volumes and its network. What is not there is nothing to
// do.
func (h Host) Remove(ctx context.Context, name string) error {
	var errs []error
	if err := h.Shutdown(ctx, name, 0); err != nil {
		errs = append(errs, err)
	}
	if d, err := h.L.DomainLookupByName(name); err == nil {
		if err := h.L.DomainUndefineFlags(d, golibvirt.DomainUndefineNvram); err != nil {
			errs = append(errs, fmt.Errorf("undefining the libvirt domain %s: %w", name, err))
		}
	} else if !golibvirt.IsNotFound(err) {
		errs = append(errs, err)
	}
	if err := h.Pool.Delete(rootVol(name), seedVol(name)); err != nil {
		errs = append(errs, err)
	}
	if err := (libvirtnet.Libvirt{Run: h.Run, URI: h.URI}).Down(ctx, name, ""); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
