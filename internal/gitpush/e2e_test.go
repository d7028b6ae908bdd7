package gitpush

import (
	"crypto/rand"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/testutil"
)

// guard is the proxy's part, as the tests stand it in front of git
// http-backend: a push is read, checked against branch, and forwarded
// unchanged or refused.
func guard(t *testing.T, branch string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/git-receive-pack") {
			next.ServeHTTP(w, r)
			return
		}
		if ce := r.Header.Get("Content-Encoding"); ce != "" {
			t.Errorf("git sent a push with Content-Encoding %q", ce)
		}
		push, replay, err := ReadCommands(r.Body)
		if err == nil {
			err = CheckBranch(push.Updates, branch)
		}
		if err != nil {
			if _, err := io.Copy(io.Discard, replay); err != nil {
				t.Errorf("draining a refused push: %v", err)
			}
			WriteRefusal(w, push, err)
			return
		}
		r.Body = io.NopCloser(replay)
		next.ServeHTTP(w, r)
	})
}

// gitServer serves the bare repositories under root over smart HTTP, on
// 127.0.0.1, through guard; it returns root's URL.
func gitServer(t *testing.T, root, branch string) string {
	srv := httptest.NewServer(guard(t, branch, testutil.GitHTTP(t, root, "")))
	t.Cleanup(srv.Close)
	return srv.URL
}

// push runs git push in dir and returns its combined output.
func push(t *testing.T, dir string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-C", dir, "push"}, args...)...)
	cmd.Env = append(os.Environ(), "HOME="+filepath.Dir(dir), "GIT_CONFIG_NOSYSTEM=1", "LC_ALL=C", "GIT_TERMINAL_PROMPT=0")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// A real git push through the guard: the VM's branch lands; another
// branch, a tag and a deletion are refused with a message git shows, and
// the repository is left as it was.
func TestPushThroughGuard(t *testing.T) {
	dir := testutil.Repo(t, true) // origin: ../remote.git, main pushed
	root := filepath.Dir(dir)
	bare := filepath.Join(root, "remote.git")
	testutil.Git(t, bare, "config", "http.receivepack", "true")
	url := gitServer(t, root, "feat") + "/remote.git"

	testutil.WriteFile(t, filepath.Join(dir, "work.txt"), "work\n")
	testutil.Git(t, dir, "add", ".")
	testutil.Git(t, dir, "commit", "--quiet", "-m", "work")
	head := testutil.Git(t, dir, "rev-parse", "HEAD")
	if out, err := push(t, dir, url, "HEAD:feat"); err != nil {
		t.Fatalf("pushing the VM's branch: %v\n%s", err, out)
	}
	if got := testutil.Git(t, bare, "rev-parse", "refs/heads/feat"); got != head {
		t.Fatalf("feat is %s after the push, want %s", got, head)
	}

	// A pack larger than http.postBuffer goes chunked, after git's probe
	// (a body of a flush-pkt only).
	big := make([]byte, 200<<10)
	if _, err := rand.Read(big); err != nil {
		t.Fatal(err)
	}
	testutil.WriteFile(t, filepath.Join(dir, "big.bin"), string(big))
	testutil.Git(t, dir, "add", ".")
	testutil.Git(t, dir, "commit", "--quiet", "-m", "big")
	head = testutil.Git(t, dir, "rev-parse", "HEAD")
	testutil.Git(t, dir, "config", "http.postBuffer", "65536")
	if out, err := push(t, dir, url, "HEAD:feat"); err != nil {
		t.Fatalf("pushing a large pack to the VM's branch: %v\n%s", err, out)
	}
	if got := testutil.Git(t, bare, "rev-parse", "refs/heads/feat"); got != head {
		t.Fatalf("feat is %s after the large push, want %s", got, head)
	}

	testutil.Git(t, dir, "tag", "v1")
	testutil.Git(t, dir, "commit", "--quiet", "--allow-empty", "-m", "more") // feat has news to refuse
	before := testutil.Git(t, bare, "for-each-ref")
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"another branch", []string{url, "HEAD:main"}, []string{
			`remote: push refused: refs/heads/main: this VM may push only to its own branch "feat", not "main" (hint: git push origin HEAD:feat)`,
			` ! [remote rejected] HEAD -> main (this VM may push only to its own branch "feat", not "main" (hint: git push origin HEAD:feat))`,
		}},
		{"a tag", []string{url, "v1"}, []string{
			` ! [remote rejected] v1 -> v1 (this VM may not push tags, only its branch "feat" (hint: git push origin HEAD:feat))`,
		}},
		{"a deletion", []string{"--delete", url, "feat"}, []string{
			` ! [remote rejected] feat (this VM may not delete its branch "feat")`,
		}},
		{"a good and a bad ref", []string{url, "HEAD:feat", "HEAD:other"}, []string{
			` ! [remote rejected] HEAD -> feat (refused: another ref of this push is not allowed)`,
			` ! [remote rejected] HEAD -> other (this VM may push only to its own branch "feat", not "other"`,
		}},
	} {
		out, err := push(t, dir, tc.args...)
		if err == nil {
			t.Errorf("%s: git push succeeded, want it refused:\n%s", tc.name, out)
		}
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("%s: git's output lacks %q:\n%s", tc.name, w, out)
			}
		}
		t.Logf("%s: git push %s:\n%s", tc.name, strings.Join(tc.args, " "), out)
	}
	if after := testutil.Git(t, bare, "for-each-ref"); after != before {
		t.Errorf("refused pushes changed the repository's refs:\n%s\nwant\n%s", after, before)
	}
}
