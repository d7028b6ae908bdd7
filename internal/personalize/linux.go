package personalize

import (
	"encoding/binary"
	"os"
	"syscall"
	"unsafe"
)

// Linux is the guest's kernel.
type Linux struct{}

var _ Kernel = Linux{}

// The random driver's ioctls (linux/random.h).
const (
	rndAddEntropy  = 0x40085203 // RNDADDENTROPY: struct rand_pool_info
	rndReseedCRNG  = 0x5207     // RNDRESEEDCRNG
	randomDevice   = "/dev/random"
	poolInfoHeader = 8 // int entropy_count (bits), int buf_size (bytes)
)

// AddEntropy credits b to the kernel's pool, then reseeds its CRNG from
// the pool.
func (Linux) AddEntropy(b []byte) error {
	f, err := os.OpenFile(randomDevice, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	info := make([]byte, poolInfoHeader+len(b))
	binary.NativeEndian.PutUint32(info[0:], uint32(len(b)*8))
	binary.NativeEndian.PutUint32(info[4:], uint32(len(b)))
	copy(info[poolInfoHeader:], b)
	if err := ioctl(f, rndAddEntropy, unsafe.Pointer(&info[0])); err != nil {
		return err
	}
	return ioctl(f, rndReseedCRNG, nil)
}

func ioctl(f *os.File, req uintptr, arg unsafe.Pointer) error {
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), req, uintptr(arg)); errno != 0 {
		return errno
	}
	return nil
}

// SetHostname sets the kernel's hostname.
func (Linux) SetHostname(name string) error { return syscall.Sethostname([]byte(name)) }

// Signal signals a process.
func (Linux) Signal(pid int, sig syscall.Signal) error { return syscall.Kill(pid, sig) }
