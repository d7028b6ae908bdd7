// Package accel decides between KVM and TCG for a VM. The /dev/kvm device
// node is not trusted: on hosts without working nested virtualisation it
// exists, opens, and then hangs the guest. So the probe boots a real Linux
// kernel under KVM with a timeout and uses KVM only if that kernel gets far
// enough to panic for want of a root file system (about a second with KVM).
// Results are cached until the host reboots.
package accel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/agent-vm/agent-vm/internal/atomicfile"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/hostdir"
)

// Accelerators.
const (
	KVM = "kvm"
	TCG = "tcg"
)

// TCGKernelParams are the guest kernel's parameters under TCG. norandmaps
// turns off the randomisation of each process's address space (as
// kernel.randomize_va_space=0 would): TCG looks up the code it has
// translated by the guest's addresses, so when a program's code and
// libraries sit at the same addresses in every process, the next process
// of it runs what an earlier one translated instead of translating it
// all again. A guest starts processes all the time (sessions, shells, git,
// the agent's tools): measured in a clone of the default machine, 20 runs
// of `id -u` took 1.66 s with randomised maps and 0.67 s without, 10 of
// `bash -lc true` 4.4 s and 1.5 s. What the guest gives up is the
// randomisation between its own processes, which guards one guest process
// against an exploit from another or from outside; in an agent-vm guest
// whatever runs code there has the agent's reach already (its user has
// sudo), and the host's side (QEMU, virtiofsd, the proxy) keeps its own.
// Under KVM, which translates nothing, the guest keeps it. The qemu
// driver passes it on a Direct boot's command line and in a NixOS run
// script's QEMU_KERNEL_PARAMS, the libvirt driver on its domain's kernel
// command line, the vagrant driver in the Vagrantfile's cmd_line for
// agent-vm's own box (a box with a bootloader of its own keeps its line).
const TCGKernelParams = "norandmaps"

// KernelCmdline is cmdline as a guest's kernel gets it under accelerator
// (KVM or TCG): under TCG with TCGKernelParams added.
func KernelCmdline(accelerator, cmdline string) string {
	if accelerator == KVM {
		return cmdline
	}
	return strings.TrimSpace(cmdline + " " + TCGKernelParams)
}

// Result is the decision and why.
type Result struct {
	Accel  string `json:"accel"`
	Reason string `json:"reason"`         // why this accelerator, in plain words
	Hint   string `json:"hint,omitempty"` // how to get KVM, when it is TCG
	// Key identifies what the result was measured with (host boot, QEMU,
	// kernel); a cached result with another key is measured again.
	Key string `json:"key"`
}

// Prober runs the probe.
type Prober struct {
	Run     execx.Runner
	QEMU    string   // qemu-system-<arch> path
	Kernels []string // kernels to probe with, first that exists wins
	// CacheDir holds the cached result (CacheFile); nil = no caching.
	CacheDir *hostdir.Dir
	Timeout  time.Duration // how long the kernel may take under KVM; 0 = 10s
	// Override forces an accelerator (AGENT_VM_ACCEL), skipping the probe.
	Override string
	// Device is the KVM device node; "" = /dev/kvm.
	Device string
}

// panicMarkers are what the probe kernel prints when it has come up far
// enough: it cannot mount a root file system and panics (then QEMU exits,
// thanks to panic=-1 and -no-reboot).
var panicMarkers = []string{"Kernel panic", "VFS: Unable to mount root", "Unable to mount root fs"}

// Probe returns the accelerator to use. It never fails: anything that goes
// wrong means TCG, with the reason.
func (p *Prober) Probe(ctx context.Context) Result {
	switch p.Override {
	case KVM, TCG:
		return Result{Accel: p.Override, Reason: "set by AGENT_VM_ACCEL=" + p.Override}
	case "":
	default:
		return Result{Accel: TCG, Reason: fmt.Sprintf("AGENT_VM_ACCEL=%q is not kvm or tcg", p.Override)}
	}
	if r, ok := deviceCheck(p.device()); !ok {
		return r
	}
	kernel := p.kernel()
	key := p.key(kernel)
	if r, ok := p.cached(key); ok {
		return r
	}
	r := p.measure(ctx, kernel)
	r.Key = key
	if ctx.Err() == nil {
		p.store(r)
	}
	return r
}

func (p *Prober) device() string {
	if p.Device == "" {
		return "/dev/kvm"
	}
	return p.Device
}

// deviceCheck rules out KVM when its device node is missing or not
// accessible. Nothing is cached: the check costs an open.
func deviceCheck(dev string) (Result, bool) {
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	switch {
	case err == nil:
		f.Close()
		return Result{}, true
	case errors.Is(err, os.ErrNotExist):
		return Result{Accel: TCG, Reason: dev + " does not exist", Hint: nestedHint(cpuInfo())}, false
	case errors.Is(err, os.ErrPermission):
		return Result{Accel: TCG, Reason: "no permission to open " + dev,
			Hint: "add your user to the kvm group (`sudo usermod -aG kvm $USER`) and log in again"}, false
	default:
		return Result{Accel: TCG, Reason: "opening " + dev + ": " + err.Error(), Hint: nestedHint(cpuInfo())}, false
	}
}

// KVMModule is the kernel module that gives KVM on the CPU a
// /proc/cpuinfo describes (its first vendor_id): kvm_intel for
// GenuineIntel, kvm_amd for AuthenticAMD, "" for any other vendor or
// none (an arm64 CPU, whose KVM is built in; a cpuinfo not read).
func KVMModule(cpuinfo string) string {
	for _, line := range strings.Split(cpuinfo, "\n") {
		key, value, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(key) != "vendor_id" {
			continue
		}
		switch strings.TrimSpace(value) {
		case "GenuineIntel":
			return "kvm_intel"
		case "AuthenticAMD":
			return "kvm_amd"
		}
		return ""
	}
	return ""
}

// KVMModuleName is KVMModule's module for a hint's words, or both when
// the CPU is not known to need one of them.
func KVMModuleName(cpuinfo string) string {
	if m := KVMModule(cpuinfo); m != "" {
		return m
	}
	return "kvm_intel or kvm_amd"
}

// cpuInfo is this machine's /proc/cpuinfo ("" when unreadable).
func cpuInfo() string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	return string(b)
}

// nestedHint says how to enable (nested) virtualisation on this host,
// whose CPU cpuinfo describes: with its vendor's module, else in words
// that fit either.
func nestedHint(cpuinfo string) string {
	module := KVMModule(cpuinfo)
	_, err := os.Stat("/etc/NIXOS")
	nixos := err == nil
	switch {
	case nixos && module != "":
		return fmt.Sprintf("on NixOS set boot.kernelModules = [ %q ]; and boot.extraModprobeConfig = \"options %s nested=1\"; in the host's configuration.nix (and on a VM host, enable nested virtualisation for this machine), then rebuild and reboot", strings.ReplaceAll(module, "_", "-"), module)
	case nixos:
		return "on NixOS load the KVM module of this CPU (boot.kernelModules: kvm-intel or kvm-amd) with nested=1 (boot.extraModprobeConfig) in the host's configuration.nix (and on a VM host, enable nested virtualisation for this machine), then rebuild and reboot"
	case module != "":
		return fmt.Sprintf("enable virtualisation in the firmware, or nested virtualisation if this machine is itself a VM: `echo 'options %s nested=1' | sudo tee /etc/modprobe.d/kvm-nested.conf`, reload %s (or reboot), and make sure your user is in the kvm group", module, module)
	}
	return "enable virtualisation in the firmware, or nested virtualisation if this machine is itself a VM (the nested=1 option of this CPU's KVM module, kvm_intel or kvm_amd, in /etc/modprobe.d; then reload it or reboot), and make sure your user is in the kvm group"
}

func (p *Prober) kernel() string {
	for _, k := range p.Kernels {
		if fi, err := os.Stat(k); err == nil && fi.Mode().IsRegular() {
			return k
		}
	}
	return ""
}

// measure boots the kernel under KVM and watches its serial output.
func (p *Prober) measure(ctx context.Context, kernel string) Result {
	if kernel == "" {
		return Result{Accel: TCG, Reason: "no Linux kernel to probe KVM with (build an image with `agent-vm image build`)",
			Hint: "set AGENT_VM_ACCEL=kvm if you know KVM works on this host"}
	}
	timeout := p.Timeout
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	ok, detail := Boots(ctx, p.Run, p.QEMU, KVM, kernel, timeout)
	if ok {
		return Result{Accel: KVM, Reason: "a test kernel booted under KVM"}
	}
	return Result{Accel: TCG, Reason: "KVM is present but a test kernel did not boot under it (" + detail + ")", Hint: nestedHint(cpuInfo())}
}

// Boots reports whether kernel, booted with accel, reaches its "no root
// file system" panic within timeout. detail says what happened otherwise.
func Boots(ctx context.Context, run execx.Runner, qemu, accel, kernel string, timeout time.Duration) (bool, string) {
	dir, err := os.MkdirTemp("", "agent-vm-accel-")
	if err != nil {
		return false, err.Error()
	}
	defer os.RemoveAll(dir)
	serial := filepath.Join(dir, "serial.log")
	args := []string{"-nodefaults", "-display", "none", "-no-reboot", "-m", "256",
		"-accel", accel, "-cpu", cpuFor(accel), "-machine", machineType(),
		"-kernel", kernel, "-append", consoleArg() + " root=/dev/agent-vm-probe panic=-1 loglevel=4",
		"-serial", "file:" + serial}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_, err = run.Run(pctx, execx.Cmd{Path: qemu, Args: args})
	out, _ := os.ReadFile(serial)
	for _, m := range panicMarkers {
		if strings.Contains(string(out), m) {
			return true, ""
		}
	}
	switch {
	case pctx.Err() != nil && ctx.Err() == nil:
		return false, fmt.Sprintf("no progress in %s", timeout)
	case err != nil:
		var ee *execx.Error
		if errors.As(err, &ee) && ee.Stderr != "" {
			return false, execx.TailLines(ee.Stderr, 1)
		}
		return false, err.Error()
	default:
		return false, "the kernel stopped without reaching user space"
	}
}

func cpuFor(accel string) string {
	if accel == KVM {
		return "host"
	}
	return "max"
}

func machineType() string {
	if runtime.GOARCH == "arm64" {
		return "virt"
	}
	return "q35"
}

func consoleArg() string {
	if runtime.GOARCH == "arm64" {
		return "console=ttyAMA0"
	}
	return "console=ttyS0"
}

// key identifies the conditions of a measurement: the host's boot, the QEMU
// binary and the kernel.
func (p *Prober) key(kernel string) string {
	boot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	return strings.Join([]string{strings.TrimSpace(string(boot)), stamp(p.QEMU), stamp(kernel)}, "|")
}

func stamp(path string) string {
	fi, err := os.Stat(path)
	if err != nil {
		return path
	}
	st := fi.Sys().(*syscall.Stat_t)
	return fmt.Sprintf("%s:%d:%d", path, st.Ino, fi.ModTime().UnixNano())
}

// CacheFile, in Prober.CacheDir, holds the last measurement.
const CacheFile = "accel.json"

func (p *Prober) cached(key string) (Result, bool) {
	if p.CacheDir == nil {
		return Result{}, false
	}
	b, err := os.ReadFile(filepath.Join(p.CacheDir.Path, CacheFile))
	if err != nil {
		return Result{}, false
	}
	var r Result
	if json.Unmarshal(b, &r) != nil || r.Key != key || (r.Accel != KVM && r.Accel != TCG) {
		return Result{}, false
	}
	return r, true
}

func (p *Prober) store(r Result) {
	if p.CacheDir == nil || p.CacheDir.Make() != nil {
		return // a cache: the next probe tries again
	}
	b, _ := json.Marshal(r)
	_ = atomicfile.Write(filepath.Join(p.CacheDir.Path, CacheFile), b, 0o600)
}
