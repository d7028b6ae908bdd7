package egress

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/agent-vm/agent-vm/internal/atomicfile"
)

// Front is the proxy's TCP front, for a guest that reaches the host over
// a network of its own rather than through QEMU's user network: a libvirt
// network whose host end (the bridge's address, Addr) the guest's packets
// to the proxy address are led to by the driver's firewall (DNAT). Every
// listener takes a port the kernel chooses, so no program already on a
// port of the host's wildcard address stands in the way, and PortsFile
// says which: the driver reads it to write its firewall rules.
type Front struct {
	// Addr is the host address to listen on (the bridge's).
	Addr netip.Addr
	// Exposed are the exposed host ports, each served on a port of its own (a
	// connection there is a exposed-port connection to that host port, checked
	// against the policy like one that came through the exposed-port socket).
	Exposed []int
	// PortsFile is where the chosen ports are written (FrontPorts, JSON,
	// 0600) once every listener is open.
	PortsFile string
}

// FrontPorts is what Front's PortsFile says: the proxy's port at Addr,
// and for each exposed host port the port at Addr that leads to it.
type FrontPorts struct {
	Addr    string      `json:"addr"`
	Proxy   int         `json:"proxy"`
	Exposed map[int]int `json:"exposed,omitempty"`
}

// front is an open Front: its listeners, not yet served.
type front struct {
	proxy   net.Listener
	exposed map[int]net.Listener
}

func (f *front) close() {
	if f == nil {
		return
	}
	f.proxy.Close()
	for _, l := range f.exposed {
		l.Close()
	}
}

// listenFront opens f's listeners and writes its ports file; on failure
// nothing stays open.
func listenFront(f Front) (*front, error) {
	if !f.Addr.IsValid() || f.PortsFile == "" {
		return nil, errors.New("internal error: the proxy's TCP front needs an address and a ports file")
	}
	at := net.JoinHostPort(f.Addr.String(), "0")
	pl, err := net.Listen("tcp", at)
	if err != nil {
		return nil, fmt.Errorf("the egress proxy cannot listen on %s: %w", f.Addr, err)
	}
	o := &front{proxy: pl, exposed: map[int]net.Listener{}}
	ports := FrontPorts{Addr: f.Addr.String(), Proxy: listenerPort(pl), Exposed: map[int]int{}}
	for _, d := range f.Exposed {
		if d < 1 || d > 65535 {
			o.close()
			return nil, fmt.Errorf("exposed port %d is not a port number", d)
		}
		if _, ok := o.exposed[d]; ok {
			continue
		}
		l, err := net.Listen("tcp", at)
		if err != nil {
			o.close()
			return nil, fmt.Errorf("the egress proxy cannot listen on %s for exposed port %d: %w", f.Addr, d, err)
		}
		o.exposed[d] = l
		ports.Exposed[d] = listenerPort(l)
	}
	if err := atomicfile.WriteJSON(f.PortsFile, ports, 0o600); err != nil {
		o.close()
		return nil, fmt.Errorf("writing the proxy's ports: %w", err)
	}
	return o, nil
}

func listenerPort(l net.Listener) int { return l.Addr().(*net.TCPAddr).Port }

// serveFront serves f's listeners until they are closed; the first error
// goes to errc.
func (p *Proxy) serveFront(f *front, errc chan<- error) {
	go func() { errc <- p.ServeProxy(f.proxy) }()
	for d, l := range f.exposed {
		go func() {
			errc <- serve(l, func(c net.Conn) { p.relayExposed(c, bufio.NewReader(c), d) })
		}()
	}
}

// ReadFrontPorts reads a Front's ports file.
func ReadFrontPorts(path string) (FrontPorts, error) {
	var fp FrontPorts
	b, err := os.ReadFile(path)
	if err == nil {
		err = json.Unmarshal(b, &fp)
	}
	if err == nil && (fp.Proxy < 1 || fp.Proxy > 65535) {
		err = errors.New("no proxy port")
	}
	if err != nil {
		return FrontPorts{}, fmt.Errorf("the egress proxy's ports (%s): %w", path, err)
	}
	return fp, nil
}
