package vm_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/hostdir"
	"github.com/agent-vm/agent-vm/internal/netpolicy"
	"github.com/agent-vm/agent-vm/internal/qemu"
	"github.com/agent-vm/agent-vm/internal/qmp"
	"github.com/agent-vm/agent-vm/internal/secret"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
	"github.com/agent-vm/agent-vm/internal/vm"
)

// secretsStayOnTheHost starts a VM with a token in the host's store,
// bound to a git host outside this machine (a network namespace on
// 198.18.0.0/15: testutil.NewUpstream). The guest holds a placeholder; its
// requests reach the host with the real token, and its pushes land on the
// VM's own branch alone; the same placeholder sent to another intercepted
// host is refused; the net log names each swap and refusal. Afterwards
// neither the guest's memory (QMP dump-guest-memory) nor its disk holds
// the token. TestTemplate runs it with a template of the VM's machine, so
// the VM starts from that (the secrets reach a clone as they reach any
// VM, after its start) rather than costing a cold boot of its own.
func secretsStayOnTheHost(t *testing.T, m *vm.Manager) {
	token := "canary-token-" + strings.ReplaceAll(time.Now().Format("150405.000000"), ".", "")
	up := tu.NewUpstream(t, tu.UpstreamOptions{Password: token})
	bare, urlPath := up.BareRepo(t, "r")

	// The proxy trusts the upstream's test CA and leads the test names to
	// its address, which is allowed as itself (it is not global).
	caFile := filepath.Join(t.TempDir(), "upstream-ca.pem")
	if err := os.WriteFile(caFile, []byte(up.CAPEM), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(egress.TestRootCAEnv, caFile)
	t.Setenv(egress.TestHostsEnv, "upstream.test="+up.Addr.String()+",other.test="+up.Addr.String())

	store := &secret.Store{Dir: hostdir.Top(t.TempDir(), 0o700, hostdir.InXDG).Sub("secrets", 0o700)}
	before := m.Secrets
	m.Secrets = store
	t.Cleanup(func() { m.Secrets = before })
	set := func(name, host, v string) {
		val, err := secret.ReadValue(strings.NewReader(v))
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Set(secret.Secret{Name: name, Hosts: []string{host}, Value: val}); err != nil {
			t.Fatal(err)
		}
	}
	set("GH_TOKEN", "upstream.test", token)
	set("OTHER_KEY", "other.test", "canary-other-"+token) // makes other.test intercepted too

	// The repository's upstream is the git host, in ssh form: the guest's
	// git is to reach it over https all the same.
	repo := tu.Repo(t, false)
	tu.Git(t, repo, "push", "--quiet", bare, "main")
	tu.Git(t, repo, "remote", "add", "origin", "git@upstream.test:"+strings.TrimPrefix(urlPath, "/"))
	const branch = "feat"
	ctx := context.Background()
	if _, err := m.Create(ctx, vm.CreateOptions{Repo: repo, Branch: branch, Backend: vm.BackendQEMU, CPUs: 1, MemoryMiB: 1024}); err != nil {
		t.Fatal(err)
	}
	e, err := m.Find(ctx, branch)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		m.Stop(sctx, branch)
	})
	// other.test is allowed by the secret bound to it; its address, not
	// being global, must be allowed as itself.
	if _, err := netpolicy.Allow(ctx, m, branch, []string{up.Addr.String()}); err != nil {
		t.Fatal(err)
	}
	res := start(t, m, branch)
	t.Logf("from the template: %v", res.FromTemplate)
	if got := strings.Join(res.Info.Secrets, " "); got != "GH_TOKEN OTHER_KEY" {
		t.Errorf("status names the secrets %q, want GH_TOKEN OTHER_KEY", got)
	}

	sh := func(script string) (int, string, string) {
		t.Helper()
		return run(t, m, branch, "sh", "-c", script)
	}
	code, ph, _ := sh(`printf %s "$GH_TOKEN"`)
	if code != 0 || !strings.HasPrefix(ph, secret.PlaceholderPrefix) || strings.Contains(ph, token) {
		t.Fatalf("the guest's GH_TOKEN is %q (exit %d), want a placeholder", ph, code)
	}

	// The bound host gets the token, over TLS the guest's curl trusts (the
	// VM's CA) with no option given.
	code, out, errs := sh(`curl -sS -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $GH_TOKEN" https://upstream.test/api/user`)
	if code != 0 || out != "200" {
		t.Errorf("curl to the bound host: exit %d, %s %s", code, out, errs)
	}
	if !received(up, "/api/user", "Bearer "+token) {
		t.Errorf("the upstream did not get the token at /api/user: %v", up.Requests())
	}
	// The same placeholder to another intercepted host: refused.
	code, out, _ = sh(`curl -sS -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $GH_TOKEN" https://other.test/api/user`)
	if out == "200" || receivedHost(up, "other.test") {
		t.Errorf("the placeholder sent to other.test was let through (exit %d, status %s)", code, out)
	}

	// A bound host that sends back what it was sent (as GitHub quotes an
	// unsupported X-GitHub-Api-Version, an echo endpoint any header):
	// the placeholder outside a credential's header is refused before it
	// leaves, and what comes back of the credential holds the placeholder,
	// plain or gzip, never the token.
	up.Handle("/echo", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Echo", r.Header.Get("Authorization"))
		text := fmt.Sprintf(`{"message":"bad version %q","auth":%q}`, r.Header.Get("X-Github-Api-Version"), r.Header.Get("Authorization"))
		if r.URL.Query().Get("gzip") != "" {
			w.Header().Set("Content-Encoding", "gzip")
			gz := gzip.NewWriter(w)
			io.WriteString(gz, text)
			gz.Close()
			return
		}
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, text)
	}))
	code, out, _ = sh(`curl -sS -w ' %{http_code}' -H "X-GitHub-Api-Version: $GH_TOKEN" https://upstream.test/echo`)
	if !strings.HasSuffix(out, " 403") || strings.Contains(out, token) || receivedPathOf(up, "/echo") {
		t.Errorf("the placeholder in X-GitHub-Api-Version: exit %d, %q, or it arrived; want 403", code, out)
	}
	for _, q := range []string{"", "?gzip=1"} {
		code, out, errs := sh(`curl -sS -i --compressed -H "Authorization: Bearer $GH_TOKEN" https://upstream.test/echo` + q)
		if code != 0 || strings.Contains(out, token) || !strings.Contains(out, ph) {
			t.Errorf("an echo of the credential%s: exit %d, the token back %v, the placeholder back %v: %s", q, code, strings.Contains(out, token), strings.Contains(out, ph), errs)
		}
	}
	// Writes fail closed: the bound host has no rule for this POST.
	code, out, _ = sh(`curl -sS -w ' %{http_code}' -X POST -d x -H "Authorization: Bearer $GH_TOKEN" https://upstream.test/deploy`)
	if !strings.HasSuffix(out, " 403") || !strings.Contains(out, "agent-vm net allow") || receivedPathOf(up, "/deploy") {
		t.Errorf("a POST no rule allows: exit %d, %q, or it arrived; want 403 naming net allow", code, out)
	}

	// A request rule, added while the VM runs, judges each request on
	// the intercepted host: this POST is refused before it leaves.
	if _, err := netpolicy.Deny(ctx, m, branch, []string{"POST upstream.test/api/**"}); err != nil {
		t.Fatal(err)
	}
	code, out, _ = sh(`curl -sS -o /dev/null -w '%{http_code}' -X POST -d x -H "Authorization: Bearer $GH_TOKEN" https://upstream.test/api/merge`)
	if out != "403" || receivedPathOf(up, "/api/merge") {
		t.Errorf("a POST a deny rule refuses: exit %d, status %s, or it arrived", code, out)
	}

	// git: a push to the VM's branch lands; main, a tag and a deletion are
	// refused with a message naming the branch the VM may push.
	if code, _, errs := sh(`git -c user.name=agent -c user.email=agent@vm.test commit --quiet --allow-empty -m work && git push upstream HEAD:` + branch); code != 0 {
		t.Errorf("git push HEAD:%s: exit %d: %s", branch, code, errs)
	}
	if got := tu.Git(t, bare, "for-each-ref", "--format=%(refname)", "refs/heads/"+branch); got == "" {
		t.Errorf("the push did not land in the upstream")
	}
	for _, refspec := range []string{"HEAD:main", "HEAD:refs/tags/v1", "--delete " + branch} {
		code, _, errs := sh(`git push upstream ` + refspec)
		if code == 0 || !strings.Contains(errs, branch) {
			t.Errorf("git push %s: exit %d, want a refusal naming %s: %s", refspec, code, branch, errs)
		}
	}
	if got := tu.Git(t, bare, "for-each-ref", "--format=%(refname)"); got != "refs/heads/"+branch+"\nrefs/heads/main" {
		t.Errorf("the upstream's refs after the refused pushes:\n%s", got)
	}

	// net log: each swap and refusal, never a value.
	entries, _, err := netpolicy.Log(ctx, m, branch)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(entries)
	if bytes.Contains(raw, []byte(token)) {
		t.Errorf("the net log holds the token")
	}
	var swapped, refused bool
	for _, x := range entries {
		swapped = swapped || (x.Kind == "https" && strings.Contains(strings.Join(x.Secrets, ","), "GH_TOKEN"))
		refused = refused || (strings.Contains(x.Error+x.Rule, "GH_TOKEN") && strings.Contains(x.Host, "other.test"))
	}
	if !swapped || !refused {
		t.Errorf("net log: a swap of GH_TOKEN %v, its refusal at other.test %v:\n%s", swapped, refused, raw)
	}

	// The guest's memory: the placeholder is there (the dump is real), the
	// token is not.
	dump := dumpGuestMemory(t, e.Layout.RunDir(), e.Record.ID)
	if !fileContains(t, dump, ph) {
		t.Errorf("the guest's memory dump does not hold the placeholder: the dump proves nothing")
	}
	if fileContains(t, dump, token) {
		t.Errorf("the guest's memory holds the token")
	}
	os.Remove(dump)
	disks, _ := filepath.Glob(filepath.Join(e.Layout.Dir, "*.qcow2"))
	if len(disks) == 0 {
		t.Fatalf("no disk in %s", e.Layout.Dir)
	}
	for _, d := range disks {
		if fileContains(t, d, token) {
			t.Errorf("the guest's disk %s holds the token", d)
		}
	}
	// Nor the VM's directory on the host.
	_ = filepath.WalkDir(e.Layout.Dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() && !strings.HasSuffix(p, ".qcow2") && fileContains(t, p, token) {
			t.Errorf("%s holds the token", p)
		}
		return nil
	})
}

// received says whether the upstream got a request for path with the
// Authorization header auth.
func received(up *tu.Upstream, path, auth string) bool {
	for _, r := range up.Requests() {
		if r.Path == path && r.Header.Get("Authorization") == auth {
			return true
		}
	}
	return false
}

// receivedHost says whether the upstream got any request for host.
func receivedHost(up *tu.Upstream, host string) bool {
	for _, r := range up.Requests() {
		if strings.HasPrefix(r.Host, host) {
			return true
		}
	}
	return false
}

// receivedPathOf says whether the upstream got a request for path.
func receivedPathOf(up *tu.Upstream, path string) bool {
	for _, r := range up.Requests() {
		if r.Path == path {
			return true
		}
	}
	return false
}

// dumpGuestMemory writes the running VM's memory to a file through its
// QMP socket (dump-guest-memory), in a directory QEMU's user may write.
func dumpGuestMemory(t *testing.T, runDir, uuid string) string {
	t.Helper()
	var sock string
	for _, dir := range []string{qemu.SocketDirFor(runDir, uuid), runDir} {
		if _, err := os.Stat(filepath.Join(dir, qemu.QMPSocket)); err == nil {
			sock = filepath.Join(dir, qemu.QMPSocket)
			break
		}
	}
	if sock == "" {
		t.Fatalf("no QMP socket for the VM in %s", runDir)
	}
	dir, err := os.MkdirTemp("", "agent-vm-dump-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil { // QEMU may run as another user
		t.Fatal(err)
	}
	ctx := tu.Context(t, "QMP's look at the guest's memory")
	c, err := qmp.Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	path := filepath.Join(dir, "memory.elf")
	if _, err := c.Execute(ctx, "dump-guest-memory", map[string]any{"paging": false, "protocol": "file:" + path}); err != nil {
		t.Fatal(err)
	}
	return path
}

// fileContains scans a file for needle in chunks.
func fileContains(t *testing.T, path, needle string) bool {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := []byte(needle)
	r := bufio.NewReaderSize(f, 1<<20)
	buf := make([]byte, 0, 2<<20)
	chunk := make([]byte, 1<<20)
	for {
		k, err := r.Read(chunk)
		buf = append(buf, chunk[:k]...)
		if bytes.Contains(buf, n) {
			return true
		}
		if len(buf) > len(n) {
			buf = append(buf[:0], buf[len(buf)-len(n):]...)
		}
		if errors.Is(err, io.EOF) {
			return false
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}
