package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-vm/agent-vm/internal/state"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// secretHome is a temporary tree for the secret commands: HOME, the
// configuration directory (the store) and the state directory under one
// root, which the tests search for the values; and every output of the
// commands run, which must hold none of them.
type secretHome struct {
	root, st, store string
	env             map[string]string
	printed         strings.Builder
}

func newSecretHome(t *testing.T) *secretHome {
	root := t.TempDir()
	return &secretHome{root: root, st: filepath.Join(root, "state"), store: filepath.Join(root, "config", "agent-vm", "secrets"),
		env: map[string]string{"HOME": filepath.Join(root, "home"), "XDG_CONFIG_HOME": filepath.Join(root, "config")}}
}

// run runs agent-vm in dir with stdin as its standard input, from a file
// outside the tree.
func (h *secretHome) run(t *testing.T, dir, stdin string, args ...string) result {
	t.Helper()
	p := filepath.Join(t.TempDir(), "stdin")
	tu.WriteFile(t, p, stdin)
	in, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	r := agentVMIn(t, dir, h.st, in, h.env, args...)
	h.printed.WriteString(r.stdout + r.stderr)
	return r
}

func (h *secretHome) mustRun(t *testing.T, dir, stdin string, args ...string) result {
	t.Helper()
	r := h.run(t, dir, stdin, args...)
	if r.code != 0 {
		t.Fatalf("agent-vm %s: exit %d\n%s%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r
}

// holding lists the files of the tree whose content holds value.
func (h *secretHome) holding(t *testing.T, value string) []string {
	t.Helper()
	var found []string
	err := filepath.WalkDir(h.root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(p)
		if err == nil && strings.Contains(string(b), value) {
			found = append(found, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

// secretRows is `secret list --json`, each object's keys checked.
func (h *secretHome) secretRows(t *testing.T) map[string]secretRow {
	t.Helper()
	out := h.mustRun(t, "", "", "secret", "list", "--json").stdout
	var objs []map[string]any
	var rows []secretRow
	if err := json.Unmarshal([]byte(out), &objs); err != nil || json.Unmarshal([]byte(out), &rows) != nil {
		t.Fatalf("secret list --json: %v\n%s", err, out)
	}
	byName := map[string]secretRow{}
	for i, o := range objs {
		var keys []string
		for k := range o {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		if got := strings.Join(keys, " "); got != "headers hosts name vm vm_id" {
			t.Errorf("secret list --json: an object has the keys %q, want headers hosts name vm vm_id", got)
		}
		byName[rows[i].Name] = rows[i]
	}
	return byName
}

// set, list (table and JSON), replace and rm: a well-known name gets its
// API's host, --host values are put in canonical form once each, --vm
// stores the VM's record id and list shows its branch while it exists.
// No value is printed, and each is in its own file alone, 0600 in 0700
// directories.
func TestSecretSetListRemove(t *testing.T) {
	h := newSecretHome(t)
	values := map[string]string{
		"ANTHROPIC_API_KEY": "sk-ant-canary-4b1f9e",
		"DEPLOY_TOKEN":      "deploy-canary-77a0c3",
		"FEAT_TOKEN":        "feat-canary-c2d915",
	}
	replacedValue := "sk-ant-first-canary-90e2"
	if r := h.mustRun(t, "", "", "secret", "list"); !strings.Contains(r.stdout, "no secrets (hint: `printenv NAME | agent-vm secret set NAME`") {
		t.Errorf("secret list of an empty store:\n%s", r.stdout)
	}
	if r := h.mustRun(t, "", "", "secret", "list", "--json"); strings.TrimSpace(r.stdout) != "[]" {
		t.Errorf("secret list --json of an empty store: %q", r.stdout)
	}

	r := h.mustRun(t, "", replacedValue+"\n", "secret", "set", "ANTHROPIC_API_KEY")
	if want := "stored secret ANTHROPIC_API_KEY, sent to api.anthropic.com only, in Authorization or x-api-key, for every VM; it takes effect when a VM next starts (running VMs keep what they started with)\n"; r.stdout != want {
		t.Errorf("secret set ANTHROPIC_API_KEY: %q, want %q", r.stdout, want)
	}
	r = h.mustRun(t, "", values["ANTHROPIC_API_KEY"]+"\n", "secret", "set", "ANTHROPIC_API_KEY")
	if !strings.HasPrefix(r.stdout, "replaced secret ANTHROPIC_API_KEY, sent to api.anthropic.com only") {
		t.Errorf("secret set of a stored name: %q, want it replaced", r.stdout)
	}
	r = h.mustRun(t, "", values["DEPLOY_TOKEN"], "secret", "set", "DEPLOY_TOKEN", "--host", "Deploy.Example.com.", "--host", "api.example.com", "--host", "deploy.example.com", "--header", "X-Deploy-Key", "--header", "x-deploy-key")
	if !strings.HasPrefix(r.stdout, "stored secret DEPLOY_TOKEN, sent to deploy.example.com, api.example.com only, in Authorization or x-deploy-key, for every VM") {
		t.Errorf("secret set --host: %q", r.stdout)
	}

	repo := tu.Repo(t, false)
	h.mustRun(t, repo, "", "create", "feat", "--backend", "qemu")
	rec, err := state.ReadRecord(state.Layout{Dir: filepath.Join(h.st, "feat")}.Record())
	if err != nil {
		t.Fatal(err)
	}
	r = h.mustRun(t, repo, values["FEAT_TOKEN"], "secret", "set", "FEAT_TOKEN", "--host", "feat.example.com", "--vm", "feat")
	if !strings.HasPrefix(r.stdout, "stored secret FEAT_TOKEN, sent to feat.example.com only, in Authorization, for VM feat only; it takes effect when the VM next starts") {
		t.Errorf("secret set --vm: %q", r.stdout)
	}

	want := "NAME               HOSTS                               HEADERS                     VM\n" +
		"ANTHROPIC_API_KEY  api.anthropic.com                   authorization,x-api-key     (all VMs)\n" +
		"DEPLOY_TOKEN       deploy.example.com,api.example.com  authorization,x-deploy-key  (all VMs)\n" +
		"FEAT_TOKEN         feat.example.com                    authorization               feat\n"
	if r := h.mustRun(t, "", "", "secret", "list"); r.stdout != want {
		t.Errorf("secret list:\n%s\nwant:\n%s", r.stdout, want)
	}
	rows := h.secretRows(t)
	if got := rows["FEAT_TOKEN"]; got.VM != "feat" || got.VMID != rec.ID || rec.ID == "" {
		t.Errorf("secret list --json: FEAT_TOKEN %+v, want vm feat and vm_id %q", got, rec.ID)
	}
	if got := rows["DEPLOY_TOKEN"]; got.VM != "" || got.VMID != "" || strings.Join(got.Hosts, " ") != "deploy.example.com api.example.com" {
		t.Errorf("secret list --json: DEPLOY_TOKEN %+v", got)
	}

	// The VM gone, its secret stays, marked so.
	h.mustRun(t, repo, "", "destroy", "feat")
	if r := h.mustRun(t, "", "", "secret", "ls"); !strings.Contains(r.stdout, "FEAT_TOKEN         feat.example.com                    authorization               (VM gone: "+rec.ID+")\n") {
		t.Errorf("secret list after the VM's destroy:\n%s", r.stdout)
	}
	if got := h.secretRows(t)["FEAT_TOKEN"]; got.VM != "" || got.VMID != rec.ID {
		t.Errorf("secret list --json after the VM's destroy: FEAT_TOKEN %+v", got)
	}

	r = h.mustRun(t, "", "", "secret", "rm", "DEPLOY_TOKEN")
	if r.stdout != "removed secret DEPLOY_TOKEN (running VMs keep it until they stop)\n" {
		t.Errorf("secret rm: %q", r.stdout)
	}
	if rows := h.secretRows(t); len(rows) != 2 {
		t.Errorf("secret list --json after rm: %v", rows)
	}

	for p, mode := range map[string]os.FileMode{filepath.Dir(h.store): 0o700, h.store: 0o700, filepath.Join(h.store, "FEAT_TOKEN.json"): 0o600} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s: %v, %v; want %04o", p, fi.Mode(), err, mode)
		}
	}
	for _, v := range append(slices.Collect(maps.Values(values)), replacedValue) {
		if strings.Contains(h.printed.String(), v) {
			t.Errorf("the value %q was printed:\n%s", v, h.printed.String())
		}
	}
	for v, want := range map[string][]string{
		values["ANTHROPIC_API_KEY"]: {filepath.Join(h.store, "ANTHROPIC_API_KEY.json")},
		values["FEAT_TOKEN"]:        {filepath.Join(h.store, "FEAT_TOKEN.json")},
		values["DEPLOY_TOKEN"]:      nil, // removed
		replacedValue:               nil,
	} {
		if got := h.holding(t, v); !slices.Equal(got, want) {
			t.Errorf("the value %q is in %q, want it in %q alone", v, got, want)
		}
	}
}

// Every refusal says what to do, prints no value and stores nothing.
func TestSecretRefusals(t *testing.T) {
	h := newSecretHome(t)
	const value = "refused-canary-5e81b0"
	repo := tu.Repo(t, false)
	for _, c := range []struct {
		stdin string
		args  []string
		code  int
		want  string
	}{
		{"", []string{"set", "MY_TOKEN", "--host", "api.example.com"}, 1, "the secret's value is empty (hint:"},
		{"\n", []string{"set", "ANTHROPIC_API_KEY"}, 1, "the secret's value is empty (hint:"},
		{value, []string{"set", "1BAD", "--host", "api.example.com"}, 1, `secret name "1BAD" is not an environment variable name (hint:`},
		{value, []string{"set", "A-B", "--host", "api.example.com"}, 1, `secret name "A-B" is not an environment variable name`},
		{value, []string{"set", "MY_TOKEN", "--host", "10.0.0.1"}, 1, `--host: secret host "10.0.0.1" is an address, not a host name`},
		{value, []string{"set", "MY_TOKEN", "--host", "localhost"}, 1, `secret host "localhost" is not a DNS name (hint:`},
		{value, []string{"set", "MY_TOKEN", "--host", "*.x.com"}, 1, `secret host "*.x.com" is not a DNS name`},
		{value, []string{"set", "MY_TOKEN", "--host", "host:443"}, 1, `secret host "host:443" is not a DNS name`},
		{value, []string{"set", "MY_TOKEN", "--host", "api.example.com:443"}, 1, `secret host "api.example.com:443" is not a DNS name`},
		{value, []string{"set", "MY_TOKEN"}, 2, "agent-vm knows none for that name (hint: `agent-vm secret set MY_TOKEN --host HOST`"},
		{value, []string{"set", "GH_TOKEN", "--header", "x api key"}, 2, `secret set GH_TOKEN --header: "x api key" is not a header name (hint: a name such as x-api-key)`},
		{value, []string{"set", "GH_TOKEN", "--header", "Authorization"}, 2, `header "Authorization" carries every secret already (hint: leave it out`},
		{value, []string{"set", "GH_TOKEN", "--header", "Cookie"}, 2, `header "Cookie" is not a credential's own header: a server may send it back`},
		{value, []string{"set", "GH_TOKEN", "--vm", "nope"}, 1, `no VM for branch "nope"`},
		{value, []string{"set", "GH_TOKEN", "--vm", ""}, 2, "--vm is empty"},
		{"", []string{"set", "GH_TOKEN", value}, 2, "secret set takes one NAME, got 2 arguments (hint:"},
		{"", []string{"set", "GH_TOKEN=" + value}, 2, "secret set takes NAME alone, never a value (hint: `printenv GH_TOKEN | agent-vm secret set GH_TOKEN`"},
		{"", []string{"rm", "GH_TOKEN=" + value}, 2, "secret rm takes NAME alone, never a value"},
		{value, []string{"set"}, 2, "secret set takes one NAME, got 0 arguments"},
		{"", []string{"rm", "NOPE_TOKEN"}, 1, "secret NOPE_TOKEN: no such secret (hint: `agent-vm secret list`"},
		{"", []string{"rm"}, 2, "secret rm takes one NAME, got 0 arguments"},
		{"", []string{"rm", "GH_TOKEN", value}, 2, "secret rm takes one NAME, got 2 arguments"},
		{"", []string{"list", "x"}, 2, "takes no arguments"},
	} {
		r := h.run(t, repo, c.stdin, append([]string{"secret"}, c.args...)...)
		if r.code != c.code || !strings.Contains(r.stderr, c.want) {
			t.Errorf("agent-vm secret %q: exit %d, want %d and %q\n%s%s", c.args, r.code, c.code, c.want, r.stdout, r.stderr)
		}
	}
	if strings.Contains(h.printed.String(), value) {
		t.Errorf("a refusal printed the value:\n%s", h.printed.String())
	}
	if got := h.holding(t, value); len(got) != 0 {
		t.Errorf("the refused value is in %q", got)
	}
	if rows := h.secretRows(t); len(rows) != 0 {
		t.Errorf("the refusals stored %v", rows)
	}
}

// A VM whose network is not contained (one of the repository's own
// Vagrantfile) has no egress proxy to hold a secret: --vm refuses it,
// saying why. The VM is a qemu one whose record is made to name the
// vagrant backend and a Vagrantfile: nothing boots, and what decides is
// the Manager's Contains.
func TestSecretForUncontainedVM(t *testing.T) {
	h := newSecretHome(t)
	repo := tu.Repo(t, false)
	h.mustRun(t, repo, "", "create", "box", "--backend", "qemu")
	l := state.Layout{Dir: filepath.Join(h.st, "box")}
	rec, err := state.ReadRecord(l.Record())
	if err != nil {
		t.Fatal(err)
	}
	rec.Backend, rec.Guest.Foreign = "vagrant", filepath.Join(repo, "Vagrantfile")
	if err := state.WriteRecord(l.Record(), rec); err != nil {
		t.Fatal(err)
	}
	r := h.run(t, repo, "vagrant-canary-1f2e", "secret", "set", "GH_TOKEN", "--vm", "box")
	want := "VM box's network is not contained (it runs the repository's own Vagrantfile): no egress proxy can hold the secret for it (hint: secrets are for VMs agent-vm sets up, created with --vagrantfile=generate on the vagrant backend; this VM's agent can get the value only in its environment, with `agent-vm run box --env GH_TOKEN`)"
	if r.code != 1 || !strings.Contains(r.stderr, want) {
		t.Errorf("secret set --vm of a vagrant VM: exit %d\n%s\nwant: %s", r.code, r.stderr, want)
	}
	if rows := h.secretRows(t); len(rows) != 0 {
		t.Errorf("the refusal stored %v", rows)
	}
}

// At a terminal, set asks for the value on stderr and reads it with the
// terminal's echo off; the terminal is as it was afterwards.
func TestSecretSetPrompt(t *testing.T) {
	master, tty := openPTY(t)
	h := newSecretHome(t)
	const value = "typed-canary-3c94aa"
	var out, errb bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- Main(context.Background(), []string{"agent-vm", "--state-dir", h.st, "secret", "set", "GH_TOKEN"},
			IO{In: tty, Out: &out, Err: &errb, Getenv: func(k string) string { return h.env[k] }})
	}()
	echo := func() bool {
		tio, err := unix.IoctlGetTermios(int(tty.Fd()), unix.TCGETS)
		if err != nil {
			t.Fatal(err)
		}
		return tio.Lflag&unix.ECHO != 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tu.Poll(ctx, "set to prompt (the terminal's echo off)", func() bool { return !echo() }); err != nil {
		t.Fatal(err)
	}
	if _, err := master.Write([]byte(value + "\n")); err != nil {
		t.Fatal(err)
	}
	if code := <-done; code != 0 {
		t.Fatalf("secret set at a terminal: exit %d\n%s%s", code, out.String(), errb.String())
	}
	if err := master.SetReadDeadline(time.Now().Add(200 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	shown, _ := io.ReadAll(master) // ends at the deadline
	if strings.Contains(string(shown), value) || strings.Contains(out.String()+errb.String(), value) {
		t.Errorf("the typed value was shown: terminal %q, output %q %q", shown, out.String(), errb.String())
	}
	if errb.String() != "value of GH_TOKEN (not echoed): \n" || !strings.HasPrefix(out.String(), "stored secret GH_TOKEN, sent to github.com, api.github.com only") {
		t.Errorf("secret set at a terminal: stdout %q, stderr %q", out.String(), errb.String())
	}
	if !echo() {
		t.Error("the terminal's echo is off after set")
	}
	if got, want := h.holding(t, value), []string{filepath.Join(h.store, "GH_TOKEN.json")}; !slices.Equal(got, want) {
		t.Errorf("the typed value is in %q, want %q", got, want)
	}
}

// openPTY opens a pseudo-terminal: its master, and its terminal.
func openPTY(t *testing.T) (master, tty *os.File) {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		tu.SkipOrFail(t, "no pseudo-terminals here: %v", err)
	}
	t.Cleanup(func() { master.Close() })
	var n uint32
	rc, err := master.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var ioErr error
	if err := rc.Control(func(fd uintptr) {
		if ioErr = unix.IoctlSetPointerInt(int(fd), unix.TIOCSPTLCK, 0); ioErr == nil {
			n, ioErr = unix.IoctlGetUint32(int(fd), unix.TIOCGPTN)
		}
	}); err != nil || ioErr != nil {
		t.Fatalf("unlocking the pseudo-terminal: %v %v", err, ioErr)
	}
	tty, err = os.OpenFile("/dev/pts/"+strconv.Itoa(int(n)), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tty.Close() })
	return master, tty
}
