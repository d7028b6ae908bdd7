package netpolicy

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/state"
)

// A failed install gets the refusals the proxy logged since it began,
// each once (the last of its kind), with its reason and fix; earlier
// refusals and allowed connections are not among them, and without a
// refusal the error is the install's alone.
func TestWithRefusals(t *testing.T) {
	ctx := context.Background()
	vms := newFakeVMs(t, &state.Record{})
	if err := os.MkdirAll(DirOf(vms.e.Layout), 0o700); err != nil {
		t.Fatal(err)
	}
	root, err := os.OpenRoot(DirOf(vms.e.Layout))
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	log := &egress.Log{Dir: root, Name: egress.LogFile}
	since := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	refused := []egress.Refusal{{Addr: npmPin.Addr, Why: "in 203.0.113.0/24 (documentation, TEST-NET-3), which is not globally reachable"}}
	install := errors.New("installing claude in VM feat: npm exited with status 1")
	for _, e := range []egress.LogEntry{
		{Time: since.Add(-time.Minute), Kind: "connect", Host: "old.example", Port: 443, Rule: "not on the allow-list"},
		{Time: since.Add(time.Second), Kind: "connect", Host: "registry.npmjs.org", Port: 443, Allowed: true, Rule: "allow registry.npmjs.org"},
	} {
		if err := log.Add(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := WithRefusals(ctx, vms, vms.e, "feat", since, install); err != install {
		t.Fatalf("no refusal since: %v, want the install's error as it is", err)
	}
	for i, e := range []egress.LogEntry{
		{Time: since.Add(2 * time.Second), Kind: "connect", Host: "registry.npmjs.org", Port: 443, Rule: egress.RuleAddresses, Refused: refused},
		{Time: since.Add(3 * time.Second), Kind: "connect", Host: "evil.example", Port: 443, Rule: "not on the allow-list"},
		{Time: since.Add(4 * time.Second), Kind: "connect", Host: "registry.npmjs.org", Port: 443, Rule: egress.RuleAddresses, Refused: refused},
	} {
		if err := log.Add(e); err != nil {
			t.Fatalf("entry %d: %v", i, err)
		}
	}
	err = WithRefusals(ctx, vms, vms.e, "feat", since, install)
	var re *RefusedError
	if !errors.As(err, &re) || !errors.Is(err, install) || len(re.Refusals) != 2 || !re.Refusals[0].Time.Equal(since.Add(4*time.Second)) {
		t.Fatalf("got %#v; want the install's error with two refusals, npm's the last of its two", err)
	}
	msg := err.Error()
	for _, want := range []string{
		"npm exited with status 1\nthe VM's egress proxy refused meanwhile:",
		"registry.npmjs.org:443: the name is allowed, but registry.npmjs.org resolves to 203.0.113.80, in 203.0.113.0/24 (documentation, TEST-NET-3), which is not globally reachable",
		"hint: agent-vm setup (it pins registry.npmjs.org",
		"or agent-vm net allow --vm feat 203.0.113.80",
		`evil.example:443: denied by the rule "not on the allow-list" (hint: agent-vm net allow --vm feat evil.example)`,
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("the error lacks %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "old.example") {
		t.Errorf("a refusal from before the install is in the error:\n%s", msg)
	}
	if WithRefusals(ctx, vms, vms.e, "feat", since, nil) != nil {
		t.Error("no failure became one")
	}
}
