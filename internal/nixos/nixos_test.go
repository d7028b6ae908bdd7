package nixos

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/sshkeys"
	"github.com/agent-vm/agent-vm/internal/state"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// hostile are branch names and key comments that would break Nix text if
// they were ever spliced into it.
var hostile = []string{
	`feature/x`,
	`quote"in'name`,
	`dollar-${builtins.abort "pwned"}`,
	`back\slash\\n`,
	"new\nline",
	`''; builtins.abort "x"; ''`,
	`\${}`,
}

// testVM makes a VM directory with a record and keys, as create would.
func testVM(t *testing.T, branch, keyComment string) (state.Layout, *state.Record) {
	t.Helper()
	l := state.Layout{Dir: t.TempDir()}
	os.MkdirAll(l.SSHDir(), 0o700)
	os.MkdirAll(l.SecretsDir(), 0o700)
	kp, _ := sshkeys.Generate(keyComment)
	kp.Write(l.ClientKey())
	slug, _ := state.Slug(branch)
	r := &state.Record{Version: 1, ID: state.NewID(), Branch: branch, Slug: slug, MachineName: "agent-vm-" + slug, Backend: Name,
		Ports: state.Ports{SSH: 2222, MCP: 8001}, Resources: state.Resources{CPUs: 2, MemoryMiB: 2048, DiskGiB: 10},
		Guest: state.Guest{User: "dev", UID: 1000, GID: 1000}, AllowOrigins: []string{"https://claude.ai"}}
	return l, r
}

func nixEval(t *testing.T, dir, file string) []byte {
	t.Helper()
	tu.Program(t, "nix-instantiate")
	cmd := exec.Command("nix-instantiate", "--eval", "--strict", "--json", filepath.Join(dir, file))
	cmd.Env = append(os.Environ(), "NIX_STATE_DIR="+t.TempDir())
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("nix-instantiate --eval %s: %v\n%s", file, err, stderr)
	}
	return out
}

// The data layer, evaluated by the real nix, hands every value to the
// modules exactly as agent-vm wrote it, whatever the branch and key hold.
func TestDataLayerRoundTripsHostileValues(t *testing.T) {
	for _, branch := range hostile {
		t.Run(strings.ReplaceAll(branch, "/", "_"), func(t *testing.T) {
			l, r := testVM(t, branch, "comment with \"quotes\" ${x} and \\ "+branch)
			cfg := filepath.Join(t.TempDir(), `my "vm" config ${x}.nix`)
			r.SetSection(Settings{Config: cfg})
			exe := "/opt/agent vm/bin/agent-vm"
			v, err := newVMJSON(l, r, "/nix/store/0000000000000000000000000000000-source", "virtiofs", exe)
			if err != nil {
				t.Fatal(err)
			}
			// PEM text with what Nix would read as interpolation or escapes.
			ca := "-----BEGIN CERTIFICATE-----\nMIIB${x}\\''\"\n-----END CERTIFICATE-----\n"
			v.CACertificates = []string{ca}
			v.Environment["GH_TOKEN"] = "agent-vm-placeholder-${x}\\''\""
			v.GitCredentials["git.example.com"] = "agent-vm-placeholder-0123"
			v.Packages = []string{"ripgrep", "python3", "hello'"}
			if err := writeFiles(l.Dir, v); err != nil {
				t.Fatal(err)
			}
			var got map[string]any
			if err := json.Unmarshal(nixEval(t, l.Dir, DataNix), &got); err != nil {
				t.Fatal(err)
			}
			pub, _ := os.ReadFile(l.ClientPubKey())
			want := map[string]any{
				"nixpkgs": v.Nixpkgs, "system": v.System, "userModule": cfg,
				"guest": map[string]any{
					"agent-vm": map[string]any{"guest": map[string]any{
						"enable": true, "name": r.Slug,
						"user":              map[string]any{"uid": 1000.0, "gid": 1000.0, "authorizedKeys": []any{strings.TrimSpace(string(pub))}},
						"ports":             map[string]any{"ssh": 2222.0, "mcp": 8001.0},
						"resources":         map[string]any{"memorySize": 2048.0, "cores": 2.0, "diskSize": 10240.0},
						"workspace":         map[string]any{"transport": "virtiofs"},
						"agentVmExecutable": exe,
						"guidance":          v.Guidance,
						"packages":          []any{"ripgrep", "python3", "hello'"},
					}},
					"services": map[string]any{"agent-mcp": map[string]any{"allowOrigin": []any{"https://claude.ai"}}},
					"security": map[string]any{"pki": map[string]any{"certificates": []any{ca}}},
					"environment": map[string]any{"sessionVariables": map[string]any{
						"NODE_EXTRA_CA_CERTS": "/etc/ssl/certs/ca-certificates.crt", "GH_TOKEN": v.Environment["GH_TOKEN"]}},
					"programs": map[string]any{"git": map[string]any{"enable": true, "config": map[string]any{
						"url": map[string]any{"https://git.example.com/": map[string]any{"insteadOf": []any{"git@git.example.com:", "ssh://git@git.example.com/"}}},
						"credential": map[string]any{"https://git.example.com": map[string]any{"helper": []any{"",
							`!f() { test "$1" = get && printf 'username=agent-vm\npassword=%s\n' agent-vm-placeholder-0123; }; f`}}},
					}}},
				},
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("nix evaluated\n%v\nwant\n%v", got, want)
			}
			// The comment survived intact inside the key.
			if !strings.Contains(string(pub), branch) {
				t.Fatalf("test setup: key comment lacks the branch")
			}
		})
	}
}

func TestDataLayerNullsForAbsentModuleAndExecutable(t *testing.T) {
	l, r := testVM(t, "main", "k")
	v, _ := newVMJSON(l, r, "/nix/store/x-source", "9p", "")
	writeFiles(l.Dir, v)
	var got struct {
		UserModule *string `json:"userModule"`
		Guest      struct {
			AgentVM struct {
				Guest struct {
					AgentVmExecutable *string `json:"agentVmExecutable"`
					Workspace         struct{ Transport string }
				} `json:"guest"`
			} `json:"agent-vm"`
		} `json:"guest"`
	}
	json.Unmarshal(nixEval(t, l.Dir, DataNix), &got)
	if got.UserModule != nil || got.Guest.AgentVM.Guest.AgentVmExecutable != nil || got.Guest.AgentVM.Guest.Workspace.Transport != "9p" {
		t.Errorf("got %+v", got)
	}
}

// The expressions are the same bytes for every VM: nothing per-branch is
// ever in Nix text.
func TestExpressionsAreStatic(t *testing.T) {
	var first map[string][]byte
	for _, branch := range hostile {
		l, r := testVM(t, branch, branch)
		v, _ := newVMJSON(l, r, "/nix/store/x-source", "virtiofs", "")
		writeFiles(l.Dir, v)
		files := map[string][]byte{}
		for _, f := range []string{DefaultNix, DataNix, "modules/guest.nix", "modules/agent-mcp.nix"} {
			b, err := os.ReadFile(filepath.Join(l.Dir, f))
			if err != nil {
				t.Fatal(err)
			}
			files[f] = b
		}
		if first == nil {
			first = files
			continue
		}
		if !reflect.DeepEqual(first, files) {
			t.Fatalf("the .nix files differ between VMs (branch %q)", branch)
		}
	}
	// And they never name the VM directory itself as a path: that would copy
	// the secrets in it into the world-readable store.
	for name, b := range first {
		if strings.Contains(string(b), "./.") && !strings.HasPrefix(name, "modules/") {
			t.Errorf("%s refers to ./. (the VM directory)", name)
		}
	}
}

func TestVMJSONGolden(t *testing.T) {
	l, r := testVM(t, "feature/x", "agent-vm feature-x")
	os.WriteFile(l.ClientPubKey(), []byte("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGolden agent-vm feature-x\n"), 0o644)
	r.SetSection(Settings{Config: "/home/me/project/vm-config.nix"})
	v, err := newVMJSON(l, r, "/nix/store/00000000000000000000000000000000-source", "virtiofs", "/usr/local/bin/agent-vm")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := json.MarshalIndent(v, "", "  ")
	tu.Golden(t, filepath.Join("testdata", "vm.json.golden"), append(got, '\n'))
	for _, f := range []string{DefaultNix, DataNix} {
		b, _ := expressions.ReadFile("nix/" + f)
		tu.Golden(t, filepath.Join("testdata", f+".golden"), b)
	}
}

func TestPickNixpkgsOrder(t *testing.T) {
	cases := []struct{ flag, recorded, pinned, nixPath, want, from string }{
		{"/a", "/b", "/pin", "nixpkgs=/c", "/a", "--nixpkgs"},
		{"", "/b", "/pin", "nixpkgs=/c", "/b", "create --nixpkgs"},
		// The pin wins over NIX_PATH.
		{"", "", "/pin", "nixpkgs=/c", "/pin", "built-in"},
		// NIX_PATH only when agent-vm was not built with a pin.
		{"", "", "", "foo=/x:nixpkgs=/c", "/c", "NIX_PATH"},
		{"", "", "", "nixpkgs=flake:nixpkgs", "nixpkgs", "NIX_PATH"},
	}
	for _, c := range cases {
		got, err := pickNixpkgs(c.flag, c.recorded, c.pinned, c.nixPath)
		if err != nil || got.value != c.want || got.from != c.from {
			t.Errorf("pickNixpkgs(%q,%q,%q,%q) = %+v, %v; want %s from %s", c.flag, c.recorded, c.pinned, c.nixPath, got, err, c.want, c.from)
		}
	}
	if _, err := pickNixpkgs("", "", "", ""); err == nil || !strings.Contains(err.Error(), "--nixpkgs") {
		t.Errorf("no nixpkgs anywhere: %v", err)
	}
}

func TestResolveNixpkgsPathMustBeATree(t *testing.T) {
	dir := t.TempDir()
	_, err := resolveNixpkgs(context.Background(), nil, "", nixpkgsSource{dir, "--nixpkgs"})
	if err == nil || !strings.Contains(err.Error(), "eval-config.nix") {
		t.Errorf("got %v", err)
	}
	os.MkdirAll(filepath.Join(dir, "nixos", "lib"), 0o755)
	os.WriteFile(filepath.Join(dir, "nixos", "lib", "eval-config.nix"), nil, 0o644)
	if p, err := resolveNixpkgs(context.Background(), nil, "", nixpkgsSource{dir, "--nixpkgs"}); err != nil || p != dir {
		t.Errorf("got %q, %v", p, err)
	}
}

// An ordinary NixOS user's primary group is `users` (gid 100): the real nix
// carries gid 100 through data.nix, and guest.nix's declared uid/gid types
// (read with the real nix, lib.types.ints.between standing in for nixpkgs')
// accept it, while root's ids stay refused.
func TestGID100RendersAndTypeChecks(t *testing.T) {
	l, r := testVM(t, "main", "k")
	r.Guest.UID, r.Guest.GID = 1000, 100
	v, err := newVMJSON(l, r, "/nix/store/x-source", "virtiofs", "")
	if err != nil {
		t.Fatal(err)
	}
	if err := writeFiles(l.Dir, v); err != nil {
		t.Fatal(err)
	}
	check := `let
	  data = import ./data.nix;
	  lib = {
	    mkOption = a: a;
	    types.ints.between = lo: hi: { check = v: builtins.isInt v && lo <= v && v <= hi; };
	  };
	  guest = import ./modules/guest.nix { config = { }; options = { }; inherit lib; pkgs = { }; modulesPath = "/nonexistent"; };
	  opt = guest.options.agent-vm.guest.user;
	  u = data.guest.agent-vm.guest.user;
	in {
	  inherit (u) uid gid;
	  uidOk = opt.uid.type.check u.uid;
	  gidOk = opt.gid.type.check u.gid;
	  rootRefused = !(opt.uid.type.check 0) && !(opt.gid.type.check 0);
	}`
	if err := os.WriteFile(filepath.Join(l.Dir, "check.nix"), []byte(check), 0o644); err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(nixEval(t, l.Dir, "check.nix"), &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"uid": 1000.0, "gid": 100.0, "uidOk": true, "gidOk": true, "rootRefused": true}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("nix evaluated %v, want %v", got, want)
	}
}

// The run script's environment is exactly this list (the launcher starts it
// with nothing else): no SHARED_DIR, QEMU_OPTS, QEMU_NET_OPTS or
// QEMU_KERNEL_PARAMS can reach it from the caller.
func TestRunScriptEnvGolden(t *testing.T) {
	env := scriptEnv(state.Layout{Dir: "/state/feature-x"}, "/usr/bin:/bin")
	tu.Golden(t, filepath.Join("testdata", "run-script-env.golden"), []byte(strings.Join(env, "\n")+"\n"))
	for _, e := range env {
		name, _, _ := strings.Cut(e, "=")
		if strings.HasPrefix(name, "QEMU_") || name == "SHARED_DIR" || strings.HasPrefix(name, "NIXPKGS_QEMU_KERNEL") {
			t.Errorf("run script env sets %s", name)
		}
	}
}
