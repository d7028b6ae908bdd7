package egress

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/agent-vm/agent-vm/internal/credswap"
	"github.com/agent-vm/agent-vm/internal/gitpush"
)

// NewInterceptor is the Interceptor for a VM's secrets: the hosts set
// binds are intercepted with ca, their placeholders swapped by set
// (credswap) and the secrets' values taken out of the answers, and a git push through them may update branch alone, of
// the repository at path repo on its host ("" is any repository).
func NewInterceptor(ca *CA, set *credswap.Set, branch, repo string) *Interceptor {
	return &Interceptor{CA: ca, Bound: set.Bound, Scrub: set.Scrubber(), PushBranch: branch, PushRepo: repo,
		Rewrite: func(host string, req *http.Request) ([]string, error) {
			h, names, err := set.Swap(host, req.URL, req.Header)
			if err != nil {
				return nil, err
			}
			req.Header = h
			return names, nil
		}}
}

// maxRefusedDrain bounds what the proxy reads of a refused push's pack
// before it answers: git sends all of it before it reads the answer, and
// a connection closed under it shows a broken pipe instead of the reason.
const maxRefusedDrain = 256 << 20

// checkPush reads a git push in an intercepted tunnel: its ref updates
// must be of PushBranch alone, in PushRepo, and it may carry no push
// options. A request is a push however it is spelled (pushRepo): a path
// with receive-pack in it in any case, or receive-pack's content type; a
// push that is not a POST is refused. A push that may go on gets its body
// back to forward, the pack streamed; a refused one returns the answer
// git shows the agent (one line per ref: gitpush.WriteRefusal) and the
// rule for the log. Any other request is left alone.
func (ic *Interceptor) checkPush(req *http.Request) (refusal []byte, rule string) {
	repo, ok := pushRepo(req)
	if !ok {
		return nil, ""
	}
	if req.Method != http.MethodPost {
		return statusBytes(http.StatusMethodNotAllowed, "agent-vm: a "+req.Method+" to git's receive-pack is not a push the proxy can read\n"), "a " + req.Method + " to receive-pack"
	}
	switch ce := strings.ToLower(req.Header.Get("Content-Encoding")); ce {
	case "", "identity":
	case "gzip":
		// git compresses a small push that fits its buffer: read it as
		// it is meant, and send it on plain.
		gz, err := gzip.NewReader(req.Body)
		if err != nil {
			return statusBytes(http.StatusBadRequest, "agent-vm: a push whose gzip body cannot be read\n"), "a push with a broken gzip body"
		}
		req.Body = readCloser{gz, req.Body}
		req.Header.Del("Content-Encoding")
		req.ContentLength = -1
	default:
		return statusBytes(http.StatusUnsupportedMediaType, "agent-vm: a push with Content-Encoding "+ce+" cannot be checked\n"), "a push with Content-Encoding " + ce
	}
	push, replay, err := gitpush.ReadCommands(req.Body)
	if err == nil {
		err = gitpush.CheckBranch(push.Updates, ic.PushBranch)
	}
	if err == nil && push.Has("push-options") {
		// They follow the commands, unread here, and reach the forge's
		// hooks (GitLab makes and merges merge requests from them).
		err = errors.New("push options (git push -o) are refused: the forge acts on them, and the proxy does not read them")
	}
	if err == nil && ic.PushRepo != "" && !sameRepo(repo, ic.PushRepo) {
		err = fmt.Errorf("this VM may push only to %s, not to %s", strings.Trim(ic.PushRepo, "/"), strings.Trim(repo, "/"))
	}
	if err != nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(replay, maxRefusedDrain))
		rb := &responseBuffer{header: http.Header{}}
		gitpush.WriteRefusal(rb, push, err)
		return rb.bytes(), "push refused: " + err.Error()
	}
	req.Body = readCloser{replay, req.Body}
	return nil, ""
}

// pushRepo says whether req is a git push, however its path is spelled
// (receive-pack in any case, after a trailing slash, before ";..."), or
// by its content type alone, and the repository's path: what comes before
// the path's segment that names receive-pack ("" when none does).
func pushRepo(req *http.Request) (string, bool) {
	path := req.URL.Path
	lower := strings.ToLower(path)
	if raw := strings.ToLower(req.URL.RawPath); raw != "" && !strings.Contains(lower, "receive-pack") && strings.Contains(raw, "receive-pack") {
		lower, path = raw, req.URL.RawPath
	}
	if i := strings.LastIndex(lower, "receive-pack"); i >= 0 {
		return path[:max(strings.LastIndex(path[:i], "/"), 0)], true
	}
	mt, _, _ := strings.Cut(req.Header.Get("Content-Type"), ";")
	if strings.EqualFold(strings.TrimSpace(mt), "application/x-git-receive-pack-request") {
		return "", true
	}
	return "", false
}

// sameRepo compares two repository paths on one host, a final ".git"
// and slashes aside.
func sameRepo(a, b string) bool {
	norm := func(s string) string { return strings.TrimSuffix(strings.Trim(s, "/"), ".git") }
	return norm(a) == norm(b)
}

// readCloser reads from one reader and closes the original body.
type readCloser struct {
	io.Reader
	io.Closer
}

// responseBuffer is an http.ResponseWriter that keeps the answer, to
// send it on a connection the proxy writes itself.
type responseBuffer struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (r *responseBuffer) Header() http.Header { return r.header }
func (r *responseBuffer) WriteHeader(code int) {
	if r.code == 0 {
		r.code = code
	}
}
func (r *responseBuffer) Write(b []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	return r.body.Write(b)
}

// bytes is the answer as HTTP/1.1, closing the connection.
func (r *responseBuffer) bytes() []byte {
	resp := &http.Response{StatusCode: r.code, ProtoMajor: 1, ProtoMinor: 1, Header: r.header, Close: true,
		ContentLength: int64(r.body.Len()), Body: io.NopCloser(bytes.NewReader(r.body.Bytes()))}
	var out bytes.Buffer
	_ = resp.Write(&out)
	return out.Bytes()
}
