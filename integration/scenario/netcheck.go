package scenario

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/integration/harness"
)

// Test names the VM's egress proxy leads to the host's loopback
// (AGENT_VM_TEST_EGRESS_HOSTS): the network here reaches nothing else. The
// proxy checks their address as any name's, so the allowed one is reached
// only because 127.0.0.1 itself is allowed too.
const (
	netAllowedName = "itest-allowed.test"
	netDeniedName  = "itest-denied.test"
)

// netSetup exposes one host port and allows one test name on branch's VM before
// its first start, so that the start opens the exposed port (an exposed port
// opens at a start) and the egress proxy it starts leads the test names to the
// host's loopback: no second boot for the network steps.
type netSetup struct {
	exposed, other int      // host ports on 127.0.0.1: exposed, and not
	env            []string // the start's environment (the test names' addresses)
}

func newNetSetup(ctx context.Context, s *harness.S, branch string) (*netSetup, error) {
	if !s.TestHooks() {
		return nil, harness.Failf(nil, "this agent-vm's egress proxy has no test hooks, which the network's steps lead their test names with (hint: build it with `go build -tags agentvm_testhooks -o agent-vm ./cmd/agent-vm`; `agent-vm version` then ends in +testhooks)")
	}
	n := &netSetup{env: []string{fmt.Sprintf("AGENT_VM_TEST_EGRESS_HOSTS=%s=127.0.0.1,%s=127.0.0.1", netAllowedName, netDeniedName)}}
	var err error
	if n.exposed, err = harness.HostServer(ctx, "exposed"); err != nil {
		return nil, err
	}
	if n.other, err = harness.HostServer(ctx, "not exposed"); err != nil {
		return nil, err
	}
	for _, args := range [][]string{
		{"port", "expose", "--vm", branch, strconv.Itoa(n.exposed)},
		{"net", "allow", "--vm", branch, netAllowedName, "127.0.0.1"},
	} {
		if err := harness.Want(s.Call(ctx, harness.Call{Args: args}), 0); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// netSteps check the network's containment from inside branch's VM,
// started with n set up, as root where the claim is about the guest's
// reach: the host's loopback is unreachable at the gateway; exactly the
// exposed port answers at the proxy address; an allowed name is reached
// through the proxy and a denied one is refused with the rule and the
// command that allows it; `net log --json` lists them; mode offline
// refuses both.
func netSteps(ctx context.Context, s *harness.S, branch string, n *netSetup) {
	if n == nil { // the setup failed, and so the steps are skipped
		n = &netSetup{}
	}
	exposed, other := n.exposed, n.other
	s.Step(ctx, "network: from the guest, as root, the host answers only on the exposed port", func() error {
		direct := func(url string) *harness.Result {
			return s.Exec(ctx, branch, "sudo", "curl", "-sS", "--noproxy", "*", "--max-time", "15", url)
		}
		urls := []string{
			fmt.Sprintf("http://10.0.2.2:%d/", exposed), // the gateway: nothing
			fmt.Sprintf("http://10.0.2.2:%d/", other),
			fmt.Sprintf("http://10.0.2.100:%d/", other), // the proxy address: only exposed ports
		}
		// A server on all of the host's addresses, reached at none of them.
		wide, err := harness.HostServerOn(ctx, "0.0.0.0", "every address")
		if err != nil {
			return err
		}
		addrs, err := harness.HostAddrs()
		if err != nil {
			return err
		}
		for _, a := range append(addrs, "10.0.2.2") {
			urls = append(urls, fmt.Sprintf("http://%s/", net.JoinHostPort(a, strconv.Itoa(wide))))
		}
		for _, url := range urls {
			if res := direct(url); res.ExitCode == 0 {
				return harness.Failf(res, "the guest reached %s", url)
			}
		}
		res := direct(fmt.Sprintf("http://10.0.2.100:%d/", exposed))
		if res.ExitCode != 0 || res.Stdout != "exposed" {
			return harness.Failf(res, "the exposed host port %d at 10.0.2.100: exit %d, %q; want its answer", exposed, res.ExitCode, res.Stdout)
		}
		return nil
	})
	s.Step(ctx, "network: an allowed name is reached through the proxy, a denied one refused with the rule", func() error {
		res := s.Exec(ctx, branch, "curl", "-sS", "--max-time", "30", fmt.Sprintf("http://%s:%d/", netAllowedName, other))
		if res.ExitCode != 0 || res.Stdout != "not exposed" {
			return harness.Failf(res, "the allowed name through the proxy: exit %d, %q", res.ExitCode, res.Stdout)
		}
		res = s.Exec(ctx, branch, "curl", "-sS", "--max-time", "30", fmt.Sprintf("http://%s:%d/", netDeniedName, other))
		if res.ExitCode != 0 || !strings.Contains(res.Stdout, "rule: not on the allow-list") ||
			!strings.Contains(res.Stdout, "agent-vm net allow") || !strings.Contains(res.Stdout, netDeniedName) {
			return harness.Failf(res, "the denied name: exit %d, %q; want the proxy's refusal naming the rule", res.ExitCode, res.Stdout)
		}
		// HTTPS goes through CONNECT, refused alike (curl reports the 403).
		res = s.Exec(ctx, branch, "curl", "-sS", "--max-time", "30", "https://"+netDeniedName+"/")
		if res.ExitCode == 0 || !strings.Contains(res.Stderr, "403") {
			return harness.Failf(res, "a denied CONNECT: exit %d, want curl's report of the 403", res.ExitCode)
		}
		return nil
	})
	s.Step(ctx, "network: net log --json lists the connections with their rules", func() error {
		res := s.Call(ctx, harness.Call{Args: []string{"net", "log", "--json", branch}})
		if err := harness.Want(res, 0); err != nil {
			return err
		}
		seen := map[string]bool{}
		dec := json.NewDecoder(strings.NewReader(res.Stdout))
		for dec.More() {
			var e struct {
				Kind    string `json:"kind"`
				Host    string `json:"host"`
				Port    int    `json:"port"`
				Allowed bool   `json:"allowed"`
				Rule    string `json:"rule"`
				In      int64  `json:"bytes_in"`
			}
			if err := dec.Decode(&e); err != nil {
				return harness.Failf(res, "net log --json: %v", err)
			}
			switch {
			case e.Host == netAllowedName && e.Allowed && e.Rule == "allow "+netAllowedName && e.In > 0:
				seen["allowed"] = true
			case e.Host == netDeniedName && !e.Allowed && e.Rule == "not on the allow-list":
				seen["denied"] = true
			case e.Kind == "exposed-port" && e.Port == exposed && e.Allowed:
				seen["exposed port"] = true
			}
		}
		if len(seen) != 3 {
			return harness.Failf(res, "net log --json has %v; want the allowed name, the denied one and the exposed port", seen)
		}
		return nil
	})
	s.Step(ctx, "network: in mode offline both names are refused, the exposed port stays open", func() error {
		if err := harness.Want(s.Call(ctx, harness.Call{Args: []string{"net", "mode", "--vm", branch, "offline"}}), 0); err != nil {
			return err
		}
		for _, name := range []string{netAllowedName, netDeniedName} {
			res := s.Exec(ctx, branch, "curl", "-sS", "--max-time", "30", fmt.Sprintf("http://%s:%d/", name, other))
			if res.ExitCode != 0 || !strings.Contains(res.Stdout, "rule: mode offline") {
				return harness.Failf(res, "%s in mode offline: exit %d, %q; want the proxy's refusal naming the mode", name, res.ExitCode, res.Stdout)
			}
		}
		res := s.Exec(ctx, branch, "curl", "-sS", "--noproxy", "*", "--max-time", "15", fmt.Sprintf("http://10.0.2.100:%d/", exposed))
		if res.ExitCode != 0 || res.Stdout != "exposed" {
			return harness.Failf(res, "the exposed port in mode offline: exit %d, %q", res.ExitCode, res.Stdout)
		}
		return harness.Want(s.Call(ctx, harness.Call{Args: []string{"net", "mode", "--vm", branch, "allow"}}), 0)
	})
	s.Step(ctx, "network: in mode ask a name off the list waits while curl does, listed by net pending; net approve lets it through, net deny ID refuses it", func() error {
		return askSteps(ctx, s, branch, other)
	})
}

// askSteps sets branch's VM to mode ask and, twice, has curl in the guest
// ask for the denied name while the test answers it from the host: approve
// (curl gets the answer), then deny (curl gets the refusal naming the
// user). The VM is back in mode allow after. A VM on another host is
// refused mode ask.
func askSteps(ctx context.Context, s *harness.S, branch string, port int) error {
	res := s.Call(ctx, harness.Call{Args: []string{"net", "mode", "--vm", branch, "ask", "--wait", "120s"}})
	if s.Host() != "" { // the VM's proxy runs on that host, where nobody is asked: refused
		if res.ExitCode != 1 || !strings.Contains(res.Stderr, "mode ask is for VMs on this machine") {
			return harness.Failf(res, "net mode ask of a VM on another host: %s, want the refusal", res.Outcome())
		}
		return nil
	}
	if err := harness.Want(res, 0); err != nil {
		return err
	}
	defer s.Call(ctx, harness.Call{Args: []string{"net", "mode", "--vm", branch, "allow"}})
	ask := func(verb string) (*harness.Result, error) {
		got := make(chan *harness.Result, 1)
		go func() {
			got <- s.Exec(ctx, branch, "curl", "-sS", "--max-time", "100", fmt.Sprintf("http://%s:%d/%s", netDeniedName, port, verb))
		}()
		wctx, cancel := context.WithTimeout(ctx, 90*time.Second)
		defer cancel()
		id := 0
		err := s.Until(wctx, "curl's request in net pending", func() (bool, error) {
			select {
			case res := <-got:
				return false, harness.GiveUp(harness.Failf(res, "curl ended before an answer: %s", res.Outcome()))
			default:
			}
			res := s.Call(ctx, harness.Call{Args: []string{"net", "pending", "--json", branch}})
			var p struct {
				Asks []struct {
					ID         int
					Host, Path string
				}
			}
			if err := json.Unmarshal([]byte(res.Stdout), &p); err != nil || res.ExitCode != 0 {
				return false, harness.Failf(res, "net pending --json: %v", err)
			}
			for _, a := range p.Asks {
				if a.Host == netDeniedName && a.Path == "/"+verb {
					id = a.ID
					return true, nil
				}
			}
			return false, fmt.Errorf("pending: %s", res.Stdout)
		})
		if err != nil {
			return nil, err
		}
		if err := harness.Want(s.Call(ctx, harness.Call{Args: []string{"net", verb, "--vm", branch, strconv.Itoa(id)}}), 0); err != nil {
			return nil, err
		}
		return <-got, nil
	}
	res, err := ask("approve")
	if err != nil {
		return err
	}
	if res.ExitCode != 0 || res.Stdout != "not exposed" {
		return harness.Failf(res, "the approved request: exit %d, %q; want the server's answer", res.ExitCode, res.Stdout)
	}
	if res, err = ask("deny"); err != nil {
		return err
	}
	if res.ExitCode != 0 || !strings.Contains(res.Stdout, "refused by the user (ask ") {
		return harness.Failf(res, "the refused request: exit %d, %q; want the proxy's refusal naming the user", res.ExitCode, res.Stdout)
	}
	return nil
}
