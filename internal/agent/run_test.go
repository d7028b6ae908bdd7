package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/state"
	"golang.org/x/crypto/ssh"
)

// errNoConnect ends a fake run where it would reach the guest: what run
// asks of the Provisioner before that is what these tests check.
var errNoConnect = errors.New("fake: no guest to connect to")

// fakeVMs is a labelled fake of VMs: Find answers from its one record (or
// none), Connect refuses; any other method is a call the test did not
// expect, and the nil embedded interface panics on it.
type fakeVMs struct {
	VMs
	record *state.Record
	calls  []string
}

func (f *fakeVMs) Find(_ context.Context, name string) (state.Entry, error) {
	f.calls = append(f.calls, "Find "+name)
	if f.record == nil {
		return state.Entry{}, fmt.Errorf("VM %s: %w", name, state.ErrNotFound)
	}
	return state.Entry{Slug: name, Record: f.record}, nil
}

func (f *fakeVMs) Connect(_ context.Context, name string) (*ssh.Client, string, error) {
	f.calls = append(f.calls, "Connect "+name)
	return nil, "", errNoConnect
}

// fakeProvisioner is a labelled fake of Provisioner that records its
// calls; made says which agent a VM it creates was created with (the
// repository's config.toml's).
type fakeProvisioner struct {
	made  string
	calls []string
}

func (f *fakeProvisioner) Create(_ context.Context, branch, agent string) (VM, error) {
	f.calls = append(f.calls, fmt.Sprintf("Create %s install=%q", branch, agent))
	return VM{Slug: branch + "-vm", Branch: branch, Agent: cmpOr(agent, f.made)}, nil
}

func (f *fakeProvisioner) Start(_ context.Context, name string, keys map[string]string) (VM, bool, error) {
	var ks []string
	for k, v := range keys {
		ks = append(ks, k+"="+v)
	}
	slices.Sort(ks)
	f.calls = append(f.calls, fmt.Sprintf("Start %s keys=%v", name, ks))
	return VM{Slug: name, Branch: "feat", Contained: true}, true, nil
}

func (f *fakeProvisioner) OpenBrowser(_ context.Context, vm string) (bool, error) {
	f.calls = append(f.calls, "OpenBrowser "+vm)
	return true, nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// Run makes a branch's VM only when it has none, installing the known
// agent it is about to run (none for a program, or when the agent comes
// from the repository's configuration); it starts the VM with the agent's
// key from this environment.
func TestRunProvisionsTheBranchsVM(t *testing.T) {
	getenv := func(k string) string { return map[string]string{"ANTHROPIC_API_KEY": "sk-test"}[k] }
	for _, c := range []struct {
		name   string
		record *state.Record
		made   string
		o      RunOptions
		want   []string
	}{
		{"no VM, a known agent", nil, "", RunOptions{Agent: "claude"},
			[]string{`Create feat install="claude"`, "Start feat-vm keys=[ANTHROPIC_API_KEY=sk-test]"}},
		{"no VM, a program", nil, "", RunOptions{Agent: "./tool"},
			[]string{`Create feat install=""`, "Start feat-vm keys=[]"}},
		{"no VM, the agent from config.toml", nil, "claude", RunOptions{},
			[]string{`Create feat install=""`, "Start feat-vm keys=[ANTHROPIC_API_KEY=sk-test]"}},
		{"a VM, its own agent", &state.Record{Agent: "gemini"}, "", RunOptions{},
			[]string{"Start feat keys=[]"}},
		// The browser is opened once the guest is reached, which the fake
		// refuses.
		{"a VM, --chrome", &state.Record{Agent: "claude"}, "", RunOptions{Chrome: true},
			[]string{"Start feat keys=[ANTHROPIC_API_KEY=sk-test]"}},
	} {
		vms := &fakeVMs{record: c.record}
		p := &fakeProvisioner{made: c.made}
		c.o.Name, c.o.Getenv, c.o.Notify = "feat", getenv, func(string) {}
		_, err := Run(context.Background(), vms, p, c.o)
		if !errors.Is(err, errNoConnect) {
			t.Errorf("%s: got %v, want the fake's refusal to connect", c.name, err)
		}
		if !slices.Equal(p.calls, c.want) {
			t.Errorf("%s: the provisioner was asked %q, want %q", c.name, p.calls, c.want)
		}
	}
}

// What the user typed is checked before a VM is made: --chrome with an
// agent other than Claude Code makes none.
func TestRunChecksBeforeItCreates(t *testing.T) {
	p := &fakeProvisioner{}
	_, err := Run(context.Background(), &fakeVMs{}, p, RunOptions{Name: "feat", Agent: "codex", Chrome: true, Notify: func(string) {}})
	if err == nil || !strings.Contains(err.Error(), "--chrome is Claude Code's") {
		t.Errorf("got %v, want --chrome refused", err)
	}
	if len(p.calls) != 0 {
		t.Errorf("the provisioner was asked %q before the check", p.calls)
	}
}
