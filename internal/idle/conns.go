package idle

import (
	"bufio"
	"errors"
	"io/fs"
	"os"
	"strconv"
	"strings"
)

// tcpTables are the host's TCP socket tables (IPv4, IPv6), in the network
// namespace of the process that reads them: the host's, where QEMU's
// forwards listen.
var tcpTables = []string{"/proc/net/tcp", "/proc/net/tcp6"}

// Connections are the TCP connections on this host whose local port is
// one of ports, keyed by their two ends (hex, as the table has them): the
// ones taken by whoever listens there (QEMU, for a VM's host ports),
// established, or being established. A client's own end has the port as
// its remote one and is not among them.
func Connections(ports []int) (map[string]int, error) {
	want := map[int]bool{}
	for _, p := range ports {
		if p > 0 {
			want[p] = true
		}
	}
	out := map[string]int{}
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
	tcpEstablished = "01"
	tcpSynRecv     = "03"
)

// readTable adds to out the connections of one table (its lines are
// "sl local rem st ...", the addresses as hex ADDR:PORT).
func readTable(path string, want map[int]bool, out map[string]int) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 4 || (fs[3] != tcpEstablished && fs[3] != tcpSynRecv) {
			continue
		}
		i := strings.LastIndexByte(fs[1], ':')
		port, err := strconv.ParseUint(fs[1][i+1:], 16, 16)
		if i < 0 || err != nil || !want[int(port)] {
			continue
		}
		out[fs[1]+" "+fs[2]] = int(port)
	}
	return sc.Err()
}
