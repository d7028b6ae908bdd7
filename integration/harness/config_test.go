package harness

import (
	"bytes"
	"errors"
	"flag"
	"strings"
	"testing"
	"time"
)

func TestParseFlags(t *testing.T) {
	var out, errOut bytes.Buffer
	cfg, err := ParseFlags(nil, &out, &errOut)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Stall != DefaultStall || cfg.Run != nil || cfg.Keep || cfg.Verbose || cfg.AgentVM != "" || cfg.StateDir != "" {
		t.Errorf("defaults: %+v", cfg)
	}
	if cfg.IsTerminal {
		t.Error("a buffer is taken for a terminal")
	}

	cfg, err = ParseFlags([]string{"--agent-vm", "./a", "--state-dir", "/s", "--backend", "qemu", "--run", "^(cli|mcp)$",
		"--keep", "--stall", "20m", "--verbose", "--list"}, &out, &errOut)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.AgentVM != "./a" || cfg.StateDir != "/s" || cfg.Backend != "qemu" || !cfg.Keep || cfg.Stall != 20*time.Minute ||
		!cfg.Verbose || !cfg.List || !cfg.Run.MatchString("mcp") || cfg.Run.MatchString("lifecycle") {
		t.Errorf("parsed %+v", cfg)
	}

	for _, c := range []struct {
		args    []string
		mention string
	}{
		{[]string{"--run", "("}, "not a regular expression"},
		{[]string{"--stall", "-1m"}, "must be positive"},
		{[]string{"--timeout", "45m"}, "-timeout"}, // no step has a time to finish in
		{[]string{"--backend", "docker"}, `--backend "docker"`},
		{[]string{"lifecycle"}, `unexpected argument "lifecycle"`},
		{[]string{"--nope"}, "-nope"},
		{[]string{"--host", "big", "--backend", "vagrant"}, "--host big places VMs through the libvirt backend, not --backend vagrant"},
	} {
		errOut.Reset()
		_, err := ParseFlags(c.args, &out, &errOut)
		if err == nil || ExitCode(err) != ExitUsage || !strings.Contains(errOut.String(), c.mention) {
			t.Errorf("%q: err %v, stderr %q; want exit %d and %q said", c.args, err, errOut.String(), ExitUsage, c.mention)
		}
	}
	if cfg, err := ParseFlags([]string{"--host", "big"}, &out, &errOut); err != nil || cfg.Host != "big" || cfg.Backend != "libvirt" {
		t.Errorf("--host big: %+v, %v; want host big through the libvirt backend", cfg, err)
	}
	_, err = ParseFlags([]string{"-h"}, &out, &errOut)
	if !errors.Is(err, flag.ErrHelp) || ExitCode(err) != ExitPassed {
		t.Errorf("-h: %v", err)
	}
}

func TestSelectScenarios(t *testing.T) {
	cfg, _ := ParseFlags([]string{"--run", "c"}, &bytes.Buffer{}, &bytes.Buffer{})
	all := suite().Scenarios
	got := strings.Join(names(selectScenarios(all, cfg.Run)), ",")
	if got != "cli,lifecycle,mcp,agent-cli" {
		t.Errorf("--run c selects %s", got)
	}
	if n := len(selectScenarios(all, nil)); n != len(all) {
		t.Errorf("no filter selects %d of %d", n, len(all))
	}
}

func TestWithin(t *testing.T) {
	for _, c := range []struct {
		dir, p string
		want   bool
	}{
		{"/state", "/state/x", true}, {"/state", "/state", false}, {"/state", "/state/../etc", false},
		{"/state", "/statex/y", false}, {"/state", "/state/..x", true},
	} {
		if got := Within(c.dir, c.p); got != c.want {
			t.Errorf("within(%q, %q) = %v", c.dir, c.p, got)
		}
	}
}
