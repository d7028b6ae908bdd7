package sharejail

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The filter's rules, one per system call: which argument holds a mode,
// and whether that call also creates special files. x86-64 numbers, and
// arm64's for the *at calls arm64 has (it has no legacy chmod, open,
// mkdir, mknod, creat).
type rule struct {
	name    string
	amd64   int // -1: none
	arm64   int // -1: none
	modeArg int // the argument that is a mode; -1: deny the call outright
	mknod   bool
}

// Deny set-id bits wherever a mode is given, file types other than regular
// files in mknod, and setting extended attributes (file capabilities are
// one: security.capability). openat2 takes its mode in a struct the filter
// cannot read: it is refused with ENOSYS, and callers fall back to openat.
var rules = []rule{
	{"chmod", 90, -1, 1, false},
	{"fchmod", 91, 52, 1, false},
	{"fchmodat", 268, 53, 2, false},
	{"fchmodat2", 452, 452, 2, false},
	{"open", 2, -1, 2, false},
	{"openat", 257, 56, 3, false},
	{"creat", 85, -1, 1, false},
	{"mkdir", 83, -1, 1, false},
	{"mkdirat", 258, 34, 2, false},
	{"mknod", 133, -1, 1, true},
	{"mknodat", 259, 33, 2, true},
	{"setxattr", 188, 5, -1, false},
	{"lsetxattr", 189, 6, -1, false},
	{"fsetxattr", 190, 7, -1, false},
	{"setxattrat", 463, 463, -1, false},
	{"openat2", 437, 437, -2, false},
}

const (
	auditArchX8664   = 0xc000003e
	auditArchAArch64 = 0xc00000b7
	x32Bit           = 0x40000000

	setIDBits = unix.S_ISUID | unix.S_ISGID

	retAllow = unix.SECCOMP_RET_ALLOW
	retEPERM = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	retNOSYS = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
	retKill  = unix.SECCOMP_RET_KILL_PROCESS
)

// seccomp_data offsets.
const (
	offNr   = 0
	offArch = 4
	offArgs = 16
)

func stmt(code uint16, k uint32) unix.SockFilter { return unix.SockFilter{Code: code, K: k} }
func jump(code uint16, k uint32, jt, jf uint8) unix.SockFilter {
	return unix.SockFilter{Code: code, K: k, Jt: jt, Jf: jf}
}

// program builds the BPF program for goarch.
func program(goarch string) ([]unix.SockFilter, error) {
	arch := uint32(auditArchX8664)
	if goarch == "arm64" {
		arch = auditArchAArch64
	} else if goarch != "amd64" {
		return nil, fmt.Errorf("no seccomp filter for %s", goarch)
	}
	const (
		ld  = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeq = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		jge = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
		and = unix.BPF_ALU | unix.BPF_AND | unix.BPF_K
		ret = unix.BPF_RET | unix.BPF_K
	)
	p := []unix.SockFilter{
		stmt(ld, offArch),
		jump(jeq, arch, 1, 0),
		stmt(ret, retKill),
		stmt(ld, offNr),
	}
	if goarch == "amd64" {
		// x32 system calls have their own numbers: none is needed.
		p = append(p, jump(jge, x32Bit, 0, 1), stmt(ret, retEPERM))
	}
	for _, r := range rules {
		nr := r.amd64
		if goarch == "arm64" {
			nr = r.arm64
		}
		if nr < 0 {
			continue
		}
		var body []unix.SockFilter
		switch r.modeArg {
		case -1:
			body = []unix.SockFilter{stmt(ret, retEPERM)}
		case -2:
			body = []unix.SockFilter{stmt(ret, retNOSYS)}
		default:
			// The low 32 bits of the mode (little-endian).
			off := uint32(offArgs + 8*r.modeArg)
			body = []unix.SockFilter{
				stmt(ld, off),
				jump(unix.BPF_JMP|unix.BPF_JSET|unix.BPF_K, setIDBits, 0, 1),
				stmt(ret, retEPERM),
			}
			if r.mknod {
				// Allowed types: 0 (a regular file) and S_IFREG.
				body = append(body,
					stmt(and, unix.S_IFMT),
					jump(jeq, 0, 2, 0),
					jump(jeq, unix.S_IFREG, 1, 0),
					stmt(ret, retEPERM),
				)
			}
			body = append(body, stmt(ret, retAllow))
		}
		// Every body ends in a return: the accumulator still holds the
		// number for the next rule.
		p = append(p, jump(jeq, uint32(nr), 0, uint8(len(body))))
		p = append(p, body...)
	}
	return append(p, stmt(ret, retAllow)), nil
}

// installFilter installs the program on every thread of this process;
// children inherit it across fork and exec.
func installFilter() error {
	prog, err := program(runtime.GOARCH)
	if err != nil {
		return err
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	_, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog)))
	if errno != 0 {
		return errno
	}
	return nil
}
