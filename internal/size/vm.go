package size

import (
	"fmt"
	"runtime"
	"syscall"
)

// A new VM's size: the defaults (seed 002: 4096 MiB, 4 cores, 20 GiB, the
// cores capped at the host's) and the disk's range, a Debian or NixOS
// root with room to work (the qemu backend's base image may need more;
// it checks at create).
const (
	DefaultMemoryMiB = 4096
	DefaultDiskGiB   = 20
	MinDiskGiB       = 2
	MaxDiskGiB       = 4096
)

// DefaultCPUs is a new VM's CPU count: 4, or the host's when it has fewer.
func DefaultCPUs() int { return min(runtime.NumCPU(), 4) }

// Host is what a host has to give its VMs.
type Host struct {
	MemoryMiB int // physical RAM; 0 = unknown
	Threads   int // CPU threads
}

// ReadHost reads this host's RAM and CPU threads.
func ReadHost() Host {
	h := Host{Threads: runtime.NumCPU()}
	var si syscall.Sysinfo_t
	if syscall.Sysinfo(&si) == nil {
		h.MemoryMiB = int(uint64(si.Totalram) * uint64(si.Unit) >> 20)
	}
	return h
}

// Check checks a VM's CPUs, memory (MiB) and disk (GiB), 0 meaning the
// default, against their ranges and, unless overcommit, against the host
// h that will run it. Its errors name create's flags.
func Check(cpus, memoryMiB, diskGiB int, h Host, overcommit bool) error {
	switch {
	case cpus < 0 || cpus > 64:
		return fmt.Errorf("--cpus %d is out of range (hint: use 1 to 64)", cpus)
	case memoryMiB != 0 && memoryMiB < 256:
		return fmt.Errorf("--memory %d MiB is too small for a Linux guest (hint: use at least 512M; 4G is the default)", memoryMiB)
	case diskGiB < 0 || diskGiB > MaxDiskGiB:
		return fmt.Errorf("--disk %dG is out of range (hint: use %dG to %dG)", diskGiB, MinDiskGiB, MaxDiskGiB)
	case diskGiB != 0 && diskGiB < MinDiskGiB:
		return fmt.Errorf("--disk %dG is smaller than the %dG minimum (hint: use at least --disk %dG; %dG is the default)", diskGiB, MinDiskGiB, MinDiskGiB, DefaultDiskGiB)
	case overcommit:
	case h.MemoryMiB > 0 && memoryMiB > h.MemoryMiB:
		return fmt.Errorf("--memory %s is more than this host's %s of RAM (hint: give at most --memory %dM, or pass --overcommit if you mean it)", Human(memoryMiB), Human(h.MemoryMiB), h.MemoryMiB)
	case h.Threads > 0 && cpus > h.Threads:
		return fmt.Errorf("--cpus %d is more than this host's %d CPU threads (hint: give at most --cpus %d, or pass --overcommit if you mean it)", cpus, h.Threads, h.Threads)
	}
	return nil
}
