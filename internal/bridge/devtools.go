package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"syscall"
	"time"
)

// DevTools is what a browser's remote-debugging endpoint says of itself
// (GET /json/version).
type DevTools struct {
	// Browser is its product and version: "Chrome/126.0.6478.126".
	Browser string `json:"Browser"`
	// Protocol is the DevTools protocol's version: "1.3".
	Protocol string `json:"Protocol-Version"`
	// UserAgent is the browser's User-Agent header.
	UserAgent string `json:"User-Agent"`
	// WebSocketURL is the browser target's WebSocket (ws://ADDR/devtools/browser/ID),
	// what a DevTools client connects to.
	WebSocketURL string `json:"webSocketDebuggerUrl"`
}

// ProbeTimeout bounds one probe: the endpoint is on this host's loopback,
// so a browser that answers does so at once.
const ProbeTimeout = 3 * time.Second

// maxVersionBody bounds what is read of /json/version (a few hundred bytes
// from a browser).
const maxVersionBody = 64 << 10

// ProbeDevTools asks the DevTools endpoint at addr (a loopback address and
// port, 127.0.0.1:9222) what browser it is. Only the loopback is asked: a
// DevTools endpoint gives whoever reaches it the whole browser (its
// cookies, its logged-in sessions), so agent-vm never leads a guest to one
// elsewhere. No proxy and no redirect is followed, for the same reason.
func ProbeDevTools(ctx context.Context, addr string) (DevTools, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return DevTools{}, fmt.Errorf("DevTools address %q is not HOST:PORT: %w", addr, err)
	}
	if a, err := netip.ParseAddr(host); err != nil || !a.Unmap().IsLoopback() {
		return DevTools{}, fmt.Errorf("DevTools address %q is not on this host's loopback (127.0.0.1:PORT): agent-vm only leads a guest to a browser on the host's own loopback", addr)
	}
	ctx, cancel := context.WithTimeout(ctx, ProbeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/json/version", nil)
	if err != nil {
		return DevTools{}, err
	}
	resp, err := noProxy.Do(req)
	if err != nil {
		return DevTools{}, probeError(addr, port, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxVersionBody))
	if err != nil {
		return DevTools{}, probeError(addr, port, err)
	}
	notDevTools := func(why string) error {
		return fmt.Errorf("%s answers, but not as a browser's DevTools endpoint (GET /json/version: %s): another program has that port; stop it, or use another port", addr, why)
	}
	if resp.StatusCode != http.StatusOK {
		return DevTools{}, notDevTools(resp.Status)
	}
	var d DevTools
	if err := json.Unmarshal(body, &d); err != nil {
		return DevTools{}, notDevTools("not JSON")
	}
	if d.Browser == "" || d.WebSocketURL == "" {
		return DevTools{}, notDevTools("no Browser or webSocketDebuggerUrl")
	}
	return d, nil
}

// probeError says in plain words why nothing usable answered at addr.
func probeError(addr, port string, err error) error {
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Errorf("nothing answers on %s: start Chrome/Chromium with --remote-debugging-port=%s, or agent-vm browser BRANCH --launch", addr, port)
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Errorf("%s does not answer within %s: a browser that hangs, or another program that has the port", addr, ProbeTimeout)
	}
	return fmt.Errorf("asking %s for its DevTools version: %w", addr, err)
}

// noProxy reaches a DevTools endpoint on the host's loopback directly,
// never through a proxy the environment names, and follows no redirect:
// the probe's and the relay's client.
var noProxy = &http.Client{
	Transport:     &http.Transport{Proxy: nil, DisableKeepAlives: true},
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// DevToolsAddr is the host's loopback address of DevTools port port.
func DevToolsAddr(port int) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}
