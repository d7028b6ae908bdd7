package idle

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Conn is one connection to a VM's host port, as the listener's side of
// it (QEMU's) has it.
type Conn struct {
	Port int
	// Received is how many bytes that side has received on it (tcp_info's
	// bytes_received): it grows when a client sends a request on a
	// connection it kept open. Sent is how many it has sent that the
	// client acknowledged (bytes_acked). Both are 0, and Counted false,
	// where the kernel was not asked (the /proc tables).
	Received, Sent uint64
	Counted        bool
}

// Connections are the TCP connections on this host whose local port is
// one of ports, keyed by their two ends: the ones taken by whoever listens
// there (QEMU, for a VM's host ports), established or being established.
// A client's own end has the port as its remote one and is not among
// them. They are read from the kernel's socket diagnostics (sock_diag,
// with each one's tcp_info), in the network namespace of the process that
// asks: the host's, where QEMU's forwards listen; where that is not
// there, from /proc/net/tcp and tcp6.
func Connections(ports []int) (map[string]Conn, error) {
	want := map[int]bool{}
	for _, p := range ports {
		if p > 0 {
			want[p] = true
		}
	}
	out, err := diagConnections(want)
	if err == nil {
		return out, nil
	}
	out = map[string]Conn{}
	for _, t := range tcpTables {
		if err := readTable(t, want, out); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
	}
	return out, nil
}

// TCP states (include/net/tcp_states.h) of a connection that is or is
// becoming established.
const (
	tcpEstablished = 1
	tcpSynRecv     = 3
)

// inet_diag (include/uapi/linux/inet_diag.h): the sizes of a request and
// of a reply's header, and the attribute that carries tcp_info.
const (
	inetDiagReqLen = 56
	inetDiagMsgLen = 72
	inetDiagInfo   = 2
)

// receivedAt and ackedAt are where tcp_info holds bytes_received and
// bytes_acked.
var (
	receivedAt = int(unsafe.Offsetof(unix.TCPInfo{}.Bytes_received))
	ackedAt    = int(unsafe.Offsetof(unix.TCPInfo{}.Bytes_acked))
)

// diagConnections dumps the host's TCP connections in the states above,
// IPv4 and IPv6, with their tcp_info, and keeps those whose local port is
// wanted.
func diagConnections(want map[int]bool) (map[string]Conn, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_INET_DIAG)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	out := map[string]Conn{}
	for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
		req := make([]byte, unix.NLMSG_HDRLEN+inetDiagReqLen)
		binary.NativeEndian.PutUint32(req[0:], uint32(len(req)))
		binary.NativeEndian.PutUint16(req[4:], unix.SOCK_DIAG_BY_FAMILY)
		binary.NativeEndian.PutUint16(req[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
		r := req[unix.NLMSG_HDRLEN:]
		r[0], r[1], r[2] = family, unix.IPPROTO_TCP, 1<<(inetDiagInfo-1)
		binary.NativeEndian.PutUint32(r[4:], 1<<tcpEstablished|1<<tcpSynRecv)
		if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
			return nil, err
		}
		if err := readDiag(fd, want, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// readDiag reads one dump's replies into out, until its end.
func readDiag(fd int, want map[int]bool, out map[string]Conn) error {
	buf := make([]byte, 64<<10)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return err
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return err
		}
		for _, m := range msgs {
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				return nil
			case unix.NLMSG_ERROR:
				if len(m.Data) >= 4 {
					if errno := -int32(binary.NativeEndian.Uint32(m.Data)); errno != 0 {
						return fmt.Errorf("sock_diag: %w", syscall.Errno(errno))
					}
				}
				return errors.New("sock_diag: an error reply")
			}
			addConn(m.Data, want, out)
		}
	}
}

// addConn adds one inet_diag_msg (family, state, timer, retrans, then the
// socket's ends: ports in network order, addresses of 16 bytes) and its
// tcp_info, when its local port is wanted.
func addConn(d []byte, want map[int]bool, out map[string]Conn) {
	if len(d) < inetDiagMsgLen {
		return
	}
	sport, dport := int(binary.BigEndian.Uint16(d[4:6])), int(binary.BigEndian.Uint16(d[6:8]))
	if !want[sport] {
		return
	}
	size := net.IPv4len
	if d[0] == unix.AF_INET6 {
		size = net.IPv6len
	}
	src, dst := net.IP(d[8:8+size]), net.IP(d[24:24+size])
	c := Conn{Port: sport}
	for a := d[inetDiagMsgLen:]; len(a) >= unix.SizeofRtAttr; {
		l := int(binary.NativeEndian.Uint16(a[0:2]))
		if l < unix.SizeofRtAttr || l > len(a) {
			break
		}
		if binary.NativeEndian.Uint16(a[2:4]) == inetDiagInfo && l >= unix.SizeofRtAttr+max(receivedAt, ackedAt)+8 {
			info := a[unix.SizeofRtAttr:]
			c.Received, c.Sent, c.Counted = binary.NativeEndian.Uint64(info[receivedAt:]), binary.NativeEndian.Uint64(info[ackedAt:]), true
		}
		a = a[min(len(a), (l+3)&^3):]
	}
	out[net.JoinHostPort(src.String(), strconv.Itoa(sport))+" "+net.JoinHostPort(dst.String(), strconv.Itoa(dport))] = c
}

// tcpTables are the host's TCP socket tables (IPv4, IPv6).
var tcpTables = []string{"/proc/net/tcp", "/proc/net/tcp6"}

// readTable adds to out the connections of one table (its lines are
// "sl local rem st ...", the addresses as hex ADDR:PORT).
func readTable(path string, want map[int]bool, out map[string]Conn) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 4 || (fs[3] != "01" && fs[3] != "03") {
			continue
		}
		local, lok := tableEnd(fs[1])
		remote, rok := tableEnd(fs[2])
		if !lok || !rok || !want[int(local.Port())] {
			continue
		}
		out[local.String()+" "+remote.String()] = Conn{Port: int(local.Port())}
	}
	return sc.Err()
}

// tableEnd reads an end of a connection in a /proc table: the address in
// hex, as the kernel holds it (32-bit words in the host's byte order),
// then the port in hex.
func tableEnd(s string) (netip.AddrPort, bool) {
	a, p, ok := strings.Cut(s, ":")
	port, err := strconv.ParseUint(p, 16, 16)
	raw, herr := hex.DecodeString(a)
	if !ok || err != nil || herr != nil || (len(raw) != 4 && len(raw) != 16) {
		return netip.AddrPort{}, false
	}
	for w := 0; w < len(raw); w += 4 {
		binary.BigEndian.PutUint32(raw[w:], binary.NativeEndian.Uint32(raw[w:]))
	}
	ip, _ := netip.AddrFromSlice(raw)
	return netip.AddrPortFrom(ip.Unmap(), uint16(port)), true
}
