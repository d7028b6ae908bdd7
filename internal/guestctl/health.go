package guestctl

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/internal/guest"
)

// Health is agent-mcp's answer on /health through the forwarded port.
type Health struct {
	State  string `json:"state"` // healthy, unhealthy, unreachable, unknown (VM not running)
	Detail string `json:"detail"`
}

// SSHAnswers reports whether something speaking SSH answers on the port:
// the guest's sshd is up. It reads the banner and authenticates nothing.
func SSHAnswers(ctx context.Context, port int) bool {
	d := net.Dialer{Timeout: 500 * time.Millisecond}
	conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	defer conn.Close()
	// sshd forks and re-executes itself per connection: under TCG the
	// banner takes about half a second.
	_ = conn.SetReadDeadline(time.Now().Add(3 * time.Second))
	line, err := bufio.NewReader(conn).ReadString('\n')
	return err == nil && strings.HasPrefix(line, "SSH-")
}

// CheckHealth asks agent-mcp's /health through the forwarded port.
func CheckHealth(ctx context.Context, port int) Health {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d%s", port, guest.HealthPath), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return Health{State: "unreachable", Detail: "no answer on the MCP port (agent-mcp not up yet?)"}
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode == http.StatusOK {
		return Health{State: "healthy"}
	}
	return Health{State: "unhealthy", Detail: fmt.Sprintf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(body)))}
}
