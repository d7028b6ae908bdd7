// Package portcheck is the host's ports as the integration scenarios see
// them: whether one Answers, one that is free, and the lifecycle
// scenario's checks of `agent-vm port` (a guest server reached from the
// host, a forward ended, a taken port refused, a forward recorded while
// the VM is stopped applied at its next start).
package portcheck

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/integration/harness"
)

// serveInGuest starts `python3 -m http.server port` in the guest, detached
// from the exec session, serving a directory outside the workspace with one
// file, served.txt, whose content it returns. The server runs in that
// directory, not in /workspace (exec's), so it does not hold the
// workspace: the lifecycle's suspend, which refuses while a process uses
// it, comes after it.
func serveInGuest(ctx context.Context, s *harness.S, branch string, port int) (string, error) {
	dir := "/tmp/agent-vm-itest-" + harness.RandHex(4)
	content := "served by the guest " + harness.RandHex(8)
	script := `mkdir -p "$1" && printf '%s\n' "$2" > "$1/served.txt" && ` +
		`(cd "$1" && setsid python3 -m http.server "$3" --bind 0.0.0.0 --directory "$1" >/dev/null 2>&1 </dev/null &)`
	if _, err := s.ExecOK(ctx, branch, "sh", "-c", script, "sh", dir, content, strconv.Itoa(port)); err != nil {
		return "", err
	}
	return content, nil
}

// fetchServed gets served.txt from 127.0.0.1:port on the host until it
// Answers with want (the guest's server may still be starting); it fails
// with the last error when nothing moves for the run's --stall limit.
func fetchServed(ctx context.Context, s *harness.S, port int, want string) error {
	url := fmt.Sprintf("http://127.0.0.1:%d/served.txt", port)
	return s.Until(ctx, "the guest's server at "+url, func() (bool, error) {
		r, err := harness.HTTP(ctx, &http.Client{Timeout: 5 * time.Second}, http.MethodGet, url, nil, nil)
		if err == nil && (r.Status != http.StatusOK || r.Body != want) {
			err = fmt.Errorf("HTTP %d: %q, want %q", r.Status, r.Body, want)
		}
		return err == nil, err
	})
}

// portForwards is `port list BRANCH --json`.
type portForward struct {
	Guest int `json:"guest"`
	Host  int `json:"host"`
}

func portList(ctx context.Context, s *harness.S, branch string) ([]portForward, error) {
	res, err := s.OK(ctx, "port", "list", branch, "--json")
	if err != nil {
		return nil, err
	}
	var fwds []portForward
	if err := json.Unmarshal([]byte(res.Stdout), &fwds); err != nil {
		return nil, harness.Failf(res, "`%s` printed no JSON array: %v", res.Short(), err)
	}
	return fwds, nil
}

// hostPortOf is the host port of guestPort's forward in fwds, 0 for none.
func hostPortOf(fwds []portForward, guestPort int) int {
	for _, f := range fwds {
		if f.Guest == guestPort {
			return f.Host
		}
	}
	return 0
}

// FreeHostPort is a port nothing listens on at 127.0.0.1 right now, in a
// range agent-vm does not allocate from (so the forward keeps its number).
func FreeHostPort(lo int) (int, error) {
	for p := lo; p < lo+1000; p++ {
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err == nil {
			ln.Close()
			return p, nil
		}
	}
	return 0, fmt.Errorf("no free port on 127.0.0.1 in %d-%d", lo, lo+999)
}

// Answers reports whether something accepts a connection on 127.0.0.1:port.
func Answers(port int) bool {
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), 2*time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// CheckForward: the guest serves HTTP, `port add` forwards its port
// (to the same number, which is free), the host fetches the guest's file;
// `port rm` ends it and the host port no longer Answers.
func CheckForward(ctx context.Context, s *harness.S, branch string) error {
	guest, err := FreeHostPort(18000)
	if err != nil {
		return err
	}
	content, err := serveInGuest(ctx, s, branch, guest)
	if err != nil {
		return err
	}
	res, err := s.OK(ctx, "port", "add", "--vm", branch, strconv.Itoa(guest))
	if err != nil {
		return err
	}
	if want := fmt.Sprintf("forwarded to 127.0.0.1:%d\n", guest); !strings.HasSuffix(res.Stdout, want) {
		return harness.Failf(res, "port add on a running VM does not say the guest port is %q", want)
	}
	if err := fetchServed(ctx, s, guest, content); err != nil {
		return err
	}
	st, _, err := s.Status(ctx, branch, nil)
	if err != nil {
		return err
	}
	if len(st.Forwards) != 1 || st.Forwards[0].Guest != guest || st.Forwards[0].Host != guest {
		return harness.Failf(nil, "status --json forwards %+v, want guest %d on host %d", st.Forwards, guest, guest)
	}
	if _, err := s.OK(ctx, "port", "rm", "--vm", branch, strconv.Itoa(guest)); err != nil {
		return err
	}
	if Answers(guest) {
		return harness.Failf(nil, "127.0.0.1:%d still Answers after `port rm`", guest)
	}
	if fwds, err := portList(ctx, s, branch); err != nil || len(fwds) != 0 {
		return harness.Failf(nil, "after port rm: forwards %v (%v), want none", fwds, err)
	}
	s.Notef("guest port %d answered on 127.0.0.1:%d, and stopped after port rm", guest, guest)
	return nil
}

// CheckTaken: a host port another program listens on is refused,
// naming it, and nothing is recorded.
func CheckTaken(ctx context.Context, s *harness.S, branch string) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	busy := ln.Addr().(*net.TCPAddr).Port
	res := s.AgentVM(ctx, "port", "add", "--vm", branch, "18080", strconv.Itoa(busy))
	if err := harness.Want(res, 1); err != nil {
		return err
	}
	if !strings.Contains(res.Stderr, fmt.Sprintf("port %d is already in use on 127.0.0.1", busy)) {
		return harness.Failf(res, "the refusal does not say that port %d is in use", busy)
	}
	if fwds, err := portList(ctx, s, branch); err != nil || len(fwds) != 0 {
		return harness.Failf(nil, "after the refusal: forwards %v (%v), want none", fwds, err)
	}
	return nil
}

// AddStopped: `port add` on a stopped VM records the forward and says
// it applies at the next start. It returns the guest port.
func AddStopped(ctx context.Context, s *harness.S, branch string) (int, error) {
	guest, err := FreeHostPort(19000)
	if err != nil {
		return 0, err
	}
	res, err := s.OK(ctx, "port", "add", "--vm", branch, strconv.Itoa(guest))
	if err != nil {
		return 0, err
	}
	if !strings.Contains(res.Stdout, "applies at its next start") {
		return 0, harness.Failf(res, "port add on a stopped VM does not say the forward applies at the next start")
	}
	return guest, nil
}

// CheckAfterBoot: the forward recorded while the VM was stopped works
// once it is up.
func CheckAfterBoot(ctx context.Context, s *harness.S, branch string, guest int) error {
	fwds, err := portList(ctx, s, branch)
	if err != nil {
		return err
	}
	host := hostPortOf(fwds, guest)
	if host == 0 {
		return harness.Failf(nil, "port list has no forward of guest port %d: %v", guest, fwds)
	}
	content, err := serveInGuest(ctx, s, branch, guest)
	if err != nil {
		return err
	}
	if err := fetchServed(ctx, s, host, content); err != nil {
		return err
	}
	s.Notef("guest port %d answered on 127.0.0.1:%d after the start", guest, host)
	return nil
}
