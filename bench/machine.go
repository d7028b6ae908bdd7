package main

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"runtime"
	"strconv"
	"strings"

	"github.com/agent-vm/agent-vm/bench/report"
	"github.com/agent-vm/agent-vm/blackbox"
)

// machineInfo describes the host. Missing pieces stay empty: a results
// file from a host without QEMU is still worth having for P4/P5.
func machineInfo(ctx context.Context, av *agentVM) report.Machine {
	m := report.Machine{
		OS:        osRelease(),
		Kernel:    readTrim("/proc/sys/kernel/osrelease"),
		CPUModel:  cpuModel(),
		Cores:     runtime.NumCPU(),
		MemoryMiB: memTotalMiB(),
		Go:        runtime.Version(),
		LoadStart: loadAvg(),
		OtherVMs:  otherVMs(""),
	}
	m.Hostname, _ = os.Hostname()
	if res := runCmd(ctx, cmdSpec{Path: "qemu-system-x86_64", Args: []string{"--version"}, Timeout: quickTimeout}); res.Err == nil {
		m.QEMU, _, _ = strings.Cut(res.Stdout, "\n")
	}
	var doctor struct {
		Accel       string `json:"accel"`
		AccelReason string `json:"accel_reason"`
	}
	if res := av.run(ctx, quickTimeout, "doctor", "--json"); json.Unmarshal([]byte(res.Stdout), &doctor) == nil {
		m.Accel, m.AccelWhy = doctor.Accel, doctor.AccelReason
	}
	if img, err := baseImage(ctx, av); err == nil {
		m.Image = img.Image
	}
	return m
}

// imageInfo is the base image and what a bare QEMU needs to boot it.
type imageInfo struct {
	report.Image
	Kernel string
}

// baseImage is the first image `image list --json` names.
func baseImage(ctx context.Context, av *agentVM) (*imageInfo, error) {
	res := av.run(ctx, quickTimeout, "image", "list", "--json")
	if res.Err != nil {
		return nil, res.Err
	}
	var list []struct {
		report.Image
		Kernel string `json:"kernel"`
	}
	if err := json.Unmarshal([]byte(res.Stdout), &list); err != nil {
		return nil, err
	}
	if len(list) == 0 {
		return nil, os.ErrNotExist
	}
	return &imageInfo{Image: list[0].Image, Kernel: list[0].Kernel}, nil
}

func readTrim(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func osRelease() string {
	for _, l := range strings.Split(readTrim("/etc/os-release"), "\n") {
		if v, ok := strings.CutPrefix(l, "PRETTY_NAME="); ok {
			return strings.Trim(v, `"`)
		}
	}
	return runtime.GOOS
}

func cpuModel() string {
	return procField("/proc/cpuinfo", "model name")
}

func memTotalMiB() int {
	kb, _ := strconv.Atoi(strings.TrimSuffix(procField("/proc/meminfo", "MemTotal"), " kB"))
	return kb / 1024
}

// procField is the value of the first "key: value" line for key in a
// /proc file.
func procField(path, key string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func loadAvg() float64 {
	f := strings.Fields(readTrim("/proc/loadavg"))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// otherVMs names the QEMU processes running now whose command line does
// not mention ours (the harness's temp dir): their -name, else their pid.
func otherVMs(ours string) []string {
	var out []string
	for _, p := range blackbox.Processes() {
		if !strings.Contains(p.Name(), "qemu-system") || (ours != "" && p.Mentions(ours)) {
			continue
		}
		name := "pid " + strconv.Itoa(p.Pid)
		for i, a := range p.Argv {
			if a == "-name" && i+1 < len(p.Argv) {
				name = p.Argv[i+1]
			}
		}
		out = append(out, name)
	}
	return out
}

// rssMiB is a process's resident memory.
func rssMiB(pid int) float64 {
	kb, err := strconv.Atoi(strings.TrimSuffix(procField("/proc/"+strconv.Itoa(pid)+"/status", "VmRSS"), " kB"))
	if err != nil {
		return 0
	}
	return float64(kb) / 1024
}
