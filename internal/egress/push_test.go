package egress

import (
	"bytes"
	"compress/gzip"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/credswap"
	"github.com/agent-vm/agent-vm/internal/testutil"
)

// gitHost serves the bare repositories under root with git http-backend
// over TLS on the loopback, as allowed.test (a certificate from its own
// CA), and asks a push for Basic credentials whose password is token: the
// test's stand-in for a git host.
func gitHost(t *testing.T, root, token string) (port int, ca *CA) {
	t.Helper()
	ca = testCA(t, "git host")
	return serveTLS(t, ca, "allowed.test", testutil.GitHTTP(t, root, token)), ca
}

// A real git push through the VM's proxy, as a guest makes it: the guest
// holds a placeholder as its password, trusts the VM's CA, and goes
// through the proxy; the git host gets the real token, the VM's branch
// lands, another branch and a tag are refused with the reason git shows,
// and the log names the secret and the refusals, never the token.
func TestPushThroughTheProxy(t *testing.T) {
	const token, placeholder = "ghp_real_token_9f3c2e", "agent-vm-placeholder-0123456789abcdef"
	dir := testutil.Repo(t, true) // origin: ../remote.git, main pushed
	root := filepath.Dir(dir)
	testutil.Git(t, filepath.Join(root, "remote.git"), "config", "http.receivepack", "true")
	port, hostCA := gitHost(t, root, token)

	f := newFixture(t, Policy{Branch: "feat", Mode: ModeAllow, Allow: []string{"allowed.test", "127.0.0.1"}})
	vmCA := testCA(t, "feat")
	set, err := credswap.New([]credswap.Secret{{Name: "GH_TOKEN", Placeholder: placeholder, Value: token, Hosts: []string{"allowed.test"}}})
	if err != nil {
		t.Fatal(err)
	}
	f.p.Intercept = NewInterceptor(vmCA, set, "feat", "/remote.git")
	f.p.Intercept.Ports, f.p.Intercept.RootCAs = []int{port}, pool(hostCA)
	caFile := filepath.Join(root, "vm-ca.pem")
	testutil.WriteFile(t, caFile, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: vmCA.Certificate().Raw})))

	url := "https://x-access-token:" + placeholder + "@allowed.test:" + strconv.Itoa(port) + "/remote.git"
	push := func(args ...string) (string, error) {
		cmd := exec.Command("git", append([]string{"-C", dir, "-c", "http.proxy=" + f.url.String(), "push", url}, args...)...)
		// The guest trusts its VM's CA (GIT_SSL_CAINFO wins over the
		// configuration, and the host may set it).
		cmd.Env = append(os.Environ(), "HOME="+root, "GIT_CONFIG_NOSYSTEM=1", "LC_ALL=C", "GIT_TERMINAL_PROMPT=0", "GIT_SSL_CAINFO="+caFile)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	testutil.WriteFile(t, filepath.Join(dir, "work.txt"), "work\n")
	testutil.Git(t, dir, "add", ".")
	testutil.Git(t, dir, "commit", "--quiet", "-m", "work")
	head := testutil.Git(t, dir, "rev-parse", "HEAD")
	if out, err := push("HEAD:feat"); err != nil {
		t.Fatalf("pushing the VM's branch: %v\n%s", err, out)
	}
	if got := testutil.Git(t, filepath.Join(root, "remote.git"), "rev-parse", "refs/heads/feat"); got != head {
		t.Fatalf("feat is %s after the push, want %s", got, head)
	}
	// Push options, which the git host would hand its hooks (and a forge
	// reads as orders: merge when green, skip CI), are refused whole, by a
	// real git that sends them because the host says it takes them.
	testutil.Git(t, filepath.Join(root, "remote.git"), "config", "receive.advertisePushOptions", "true")
	testutil.WriteFile(t, filepath.Join(dir, "more.txt"), "more\n")
	testutil.Git(t, dir, "add", ".")
	testutil.Git(t, dir, "commit", "--quiet", "-m", "more")
	if out, err := push("-o", "merge_request.merge_when_pipeline_succeeds", "HEAD:feat"); err == nil || !strings.Contains(out, "push options (git push -o) are refused") {
		t.Errorf("git push -o HEAD:feat: %v\n%s\nwant the push options refused", err, out)
	}
	if got := testutil.Git(t, filepath.Join(root, "remote.git"), "rev-parse", "refs/heads/feat"); got != head {
		t.Errorf("feat is %s after the refused push with options, want %s", got, head)
	}
	testutil.Git(t, dir, "tag", "v1")
	for args, want := range map[string]string{
		"HEAD:main": ` ! [remote rejected] HEAD -> main (this VM may push only to its own branch "feat", not "main"`,
		"v1":        ` ! [remote rejected] v1 -> v1 (this VM may not push tags, only its branch "feat"`,
	} {
		out, err := push(args)
		if err == nil || !strings.Contains(out, want) {
			t.Errorf("git push %s: %v\n%s\nwant %q", args, err, out, want)
		}
	}
	if refs := testutil.Git(t, filepath.Join(root, "remote.git"), "for-each-ref", "--format=%(refname)"); refs != "refs/heads/feat\nrefs/heads/main" {
		t.Errorf("the git host has %q", refs)
	}

	// git asks twice (without credentials, then with them), then pushes.
	es := f.entries(1)
	var log strings.Builder
	var swapped, refused int
	for _, e := range es {
		log.WriteString(e.Kind + " " + e.Request + " " + e.Rule + " " + strings.Join(e.Secrets, ",") + "\n")
		if e.Kind == "https" && strings.HasSuffix(e.Request, "/git-receive-pack") {
			if e.Allowed && strings.Join(e.Secrets, ",") == "GH_TOKEN" {
				swapped++
			}
			if !e.Allowed && strings.HasPrefix(e.Rule, "push refused: ") {
				refused++
			}
		}
	}
	if swapped != 1 || refused != 3 {
		t.Errorf("the log has %d allowed pushes with GH_TOKEN and %d refused, want 1 and 3:\n%s", swapped, refused, log.String())
	}
	raw, _ := os.ReadFile(filepath.Join(f.dir, LogFile))
	if bytes.Contains(raw, []byte(token)) {
		t.Errorf("the log holds the token")
	}
}

// checkPush reads a gzip push as meant and forwards it plain; it refuses
// an encoding it cannot read, and leaves other requests alone.
func TestCheckPushEncodings(t *testing.T) {
	const zero, id = "0000000000000000000000000000000000000000", "1111111111111111111111111111111111111111"
	line := zero + " " + id + " refs/heads/feat\x00report-status side-band-64k\n"
	body := fmt.Sprintf("%04x%s0000PACK...", len(line)+4, line)
	ic := &Interceptor{PushBranch: "feat"}
	req := func(encoding string, b []byte) *http.Request {
		r, _ := http.NewRequest("POST", "https://allowed.test/o/r.git/git-receive-pack", bytes.NewReader(b))
		if encoding != "" {
			r.Header.Set("Content-Encoding", encoding)
		}
		return r
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte(body))
	zw.Close()
	r := req("gzip", gz.Bytes())
	if refusal, rule := ic.checkPush(r); refusal != nil {
		t.Fatalf("a gzip push to the VM's branch refused: %s", rule)
	}
	got, _ := io.ReadAll(r.Body)
	if string(got) != body || r.Header.Get("Content-Encoding") != "" || r.ContentLength != -1 {
		t.Errorf("forwarded %q with Content-Encoding %q, length %d; want the plain body, no encoding, streamed", got, r.Header.Get("Content-Encoding"), r.ContentLength)
	}
	if refusal, _ := ic.checkPush(req("br", []byte(body))); !bytes.HasPrefix(refusal, []byte("HTTP/1.1 415")) {
		t.Errorf("a br push: %q, want 415", refusal)
	}
	if refusal, _ := ic.checkPush(req("gzip", []byte(body))); !bytes.HasPrefix(refusal, []byte("HTTP/1.1 400")) {
		t.Errorf("a push that is not gzip but says so: %q, want 400", refusal)
	}
	other := strings.Replace(body, "refs/heads/feat", "refs/heads/main", 1)
	other = fmt.Sprintf("%04x", len(strings.Replace(line, "feat", "main", 1))+4) + other[4:]
	if refusal, rule := ic.checkPush(req("", []byte(other))); !bytes.HasPrefix(refusal, []byte("HTTP/1.1 200")) || !strings.Contains(rule, `"main"`) ||
		!bytes.Contains(refusal, []byte("ng refs/heads/main")) {
		t.Errorf("a push to main: %q, %q; want receive-pack's answer with ng for main", refusal, rule)
	}
	ic.PushRepo = "/o/other"
	if refusal, rule := ic.checkPush(req("", []byte(body))); refusal == nil || !strings.Contains(rule, "may push only to o/other, not to o/r") {
		t.Errorf("a push to another repository: %q", rule)
	}
	get, _ := http.NewRequest("GET", "https://allowed.test/o/r.git/info/refs?service=git-receive-pack", nil)
	if refusal, _ := ic.checkPush(get); refusal != nil {
		t.Errorf("a GET was checked as a push")
	}
}

// A push is read however its request is spelled: receive-pack in any
// case, with a trailing slash, a ";x", escaped, or named by its content
// type alone; a push to main by each is refused, one to the VM's branch
// goes on with its repository read from the path; a receive-pack that is
// not a POST and a push with options are refused.
func TestCheckPushSpellings(t *testing.T) {
	const zero, id = "0000000000000000000000000000000000000000", "1111111111111111111111111111111111111111"
	pushTo := func(branch, caps string) string {
		line := zero + " " + id + " refs/heads/" + branch + "\x00report-status" + caps + "\n"
		return fmt.Sprintf("%04x%s0000PACK...", len(line)+4, line)
	}
	ic := &Interceptor{PushBranch: "feat", PushRepo: "/o/r.git"}
	for _, path := range []string{"/o/r.git/GIT-RECEIVE-PACK", "/o/r.git/git-receive-pack/", "/o/r.git/git-receive-pack;x", "/o/r.git/git-%72eceive-pack", "/o/r.git/Receive-Pack"} {
		for branch, refused := range map[string]bool{"main": true, "feat": false} {
			r, err := http.NewRequest("POST", "https://allowed.test"+path, strings.NewReader(pushTo(branch, "")))
			if err != nil {
				t.Fatal(err)
			}
			refusal, rule := ic.checkPush(r)
			if (refusal != nil) != refused || refused && !strings.Contains(rule, `"main"`) {
				t.Errorf("a push to %s at %s: refused %v (%q), want refused %v", branch, path, refusal != nil, rule, refused)
			}
		}
	}
	r, _ := http.NewRequest("POST", "https://allowed.test/o/r.git/upload", strings.NewReader(pushTo("main", "")))
	r.Header.Set("Content-Type", "Application/X-Git-Receive-Pack-Request; charset=x")
	if refusal, rule := ic.checkPush(r); refusal == nil {
		t.Errorf("a push named by its content type alone went on (%q)", rule)
	}
	r, _ = http.NewRequest("PUT", "https://allowed.test/o/r.git/git-receive-pack", strings.NewReader(pushTo("feat", "")))
	if refusal, rule := ic.checkPush(r); !bytes.HasPrefix(refusal, []byte("HTTP/1.1 405")) || rule != "a PUT to receive-pack" {
		t.Errorf("a PUT to receive-pack: %q, %q; want 405", refusal, rule)
	}
	r, _ = http.NewRequest("POST", "https://allowed.test/o/r.git/git-receive-pack", strings.NewReader(pushTo("feat", " push-options")))
	if refusal, rule := ic.checkPush(r); refusal == nil || !strings.Contains(rule, "push options (git push -o) are refused") {
		t.Errorf("a push with options: %q, want it refused", rule)
	}
}
