package bridge

import (
	"context"
	"net"
	"time"

	"github.com/agent-vm/agent-vm/internal/tcpfwd"
	"github.com/hashicorp/go-hclog"
)

// dialTimeout bounds reaching a bridge's host end.
const dialTimeout = 5 * time.Second

// Tunnel serves a bridge by connecting each guest connection to the host
// end addr names (network "unix" or "tcp"); find is asked at each
// connection, so a bridge socket that changed (a new Claude in Chrome
// native host) is followed. A host end that cannot be reached closes the
// guest's connection, and the holder's log says why.
func Tunnel(network string, find func() (string, error), log hclog.Logger) func(ctx context.Context, c net.Conn) {
	return func(ctx context.Context, c net.Conn) {
		defer c.Close()
		addr, err := find()
		if err != nil {
			log.Warn("a guest connection found no host end", "error", err)
			return
		}
		d := net.Dialer{Timeout: dialTimeout}
		h, err := d.DialContext(ctx, network, addr)
		if err != nil {
			log.Warn("a guest connection could not reach the host end", "addr", addr, "error", err)
			return
		}
		defer h.Close()
		stop := context.AfterFunc(ctx, func() { c.Close(); h.Close() })
		defer stop()
		tcpfwd.Splice(c, h)
	}
}
