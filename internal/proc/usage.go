package proc

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"strconv"
	"strings"
	"time"
)

// PSS is the process's proportional set size in bytes: its resident pages,
// each shared one divided among the processes sharing it, which is what a
// VM's QEMU costs the host (RSS counts shared pages whole in every one).
func PSS(pid int) (int64, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/smaps_rollup")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Pss:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb * 1024, err
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, errors.New("no Pss line in smaps_rollup")
}

// clockTick is the kernel's USER_HZ, the unit of /proc/PID/stat's times:
// 100 on every Linux architecture agent-vm runs on.
const clockTick = 10 * time.Millisecond

// CPUTime is the processor time the process has used, user and system.
func CPUTime(pid int) (time.Duration, error) {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The fields after the parenthesised command name, from the state on:
	// utime and stime are the 14th and 15th of the whole line.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("no command name in /proc/PID/stat")
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 13 {
		return 0, errors.New("too few fields in /proc/PID/stat")
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(utime+stime) * clockTick, nil
}
