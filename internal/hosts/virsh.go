package hosts

import (
	"fmt"
	"strconv"
	"strings"
)

// The readers of virsh's answers. virsh prints its tables in English
// whatever the locale's language for these commands' keys ("CPU(s)",
// "Memory size", "State"), which is what they match.

// libvirtVersion sums up `virsh version`: "libvirt 9.0.0, hypervisor
// QEMU 7.2.0" from its "Using library:" and "Running hypervisor:" lines.
func libvirtVersion(out string) string {
	var parts []string
	f := fields(out)
	if v := f["using library"]; v != "" {
		parts = append(parts, v)
	}
	if v := f["running hypervisor"]; v != "" {
		parts = append(parts, "hypervisor "+v)
	}
	if len(parts) == 0 {
		return "libvirt answers (its version is not in `virsh version`)"
	}
	return strings.Join(parts, ", ")
}

// ParseNodeInfo reads `virsh nodeinfo`'s CPU(s) and Memory size (KiB).
func ParseNodeInfo(out string) (Node, error) {
	f := fields(out)
	cpus, err := strconv.Atoi(f["cpu(s)"])
	if err != nil || cpus <= 0 {
		return Node{}, fmt.Errorf("virsh nodeinfo gave no CPU count (CPU(s): %q)", f["cpu(s)"])
	}
	mem, ok := parseKiB(f["memory size"])
	if !ok || mem == 0 {
		return Node{}, fmt.Errorf("virsh nodeinfo gave no memory size (Memory size: %q)", f["memory size"])
	}
	return Node{CPUs: cpus, MemoryKiB: mem}, nil
}

// ParseMemStats reads `virsh nodememstats`: the total, and the memory
// available, free plus buffers plus cached (what the kernel gives back
// when asked), never above the total.
func ParseMemStats(out string) (total, avail uint64, ok bool) {
	f := fields(out)
	total, okTotal := parseKiB(f["total"])
	avail, okFree := parseKiB(f["free"])
	if !okTotal || !okFree || total == 0 {
		return 0, 0, false
	}
	for _, k := range []string{"buffers", "cached"} {
		if n, ok := parseKiB(f[k]); ok {
			avail += n
		}
	}
	return total, min(avail, total), true
}

// parseKiB reads "16303368 KiB".
func parseKiB(s string) (uint64, bool) {
	num, unit, _ := strings.Cut(strings.TrimSpace(s), " ")
	if unit = strings.TrimSpace(unit); unit != "KiB" && unit != "kB" {
		return 0, false
	}
	n, err := strconv.ParseUint(num, 10, 64)
	return n, err == nil
}

// fields reads "Key: value" lines, keys lower-cased and trimmed.
func fields(out string) map[string]string {
	m := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(l, ":")
		if ok {
			m[strings.ToLower(strings.TrimSpace(k))] = strings.TrimSpace(v)
		}
	}
	return m
}

// names reads a --name listing: one name a line, blank lines dropped.
func names(out string) []string {
	var ns []string
	for _, l := range strings.Split(out, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			ns = append(ns, l)
		}
	}
	return ns
}
