package testutil

import (
	"bytes"
	"io"
	"net/http"
	"net/http/cgi"
	"strings"
	"testing"
)

// GitHTTP serves the bare repositories under root over git's smart HTTP:
// git http-backend through net/http/cgi, every repository exported, a
// push taken where the repository has http.receivepack set. The request's
// path is the repository's below root (strip a prefix first with
// http.StripPrefix). With password set, a push (receive-pack: its
// info/refs and its POST) must carry Basic credentials with that password
// and is answered 401 otherwise, so a push that lands shows the
// credential arrived; a fetch needs none.
func GitHTTP(t testing.TB, root, password string) http.Handler {
	t.Helper()
	backend := &cgi.Handler{Path: Program(t, "git-http-backend"), Env: []string{
		"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1", "GIT_CONFIG_NOSYSTEM=1", "HOME=" + root,
	}}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		push := strings.HasSuffix(r.URL.Path, "/git-receive-pack") || r.URL.Query().Get("service") == "git-receive-pack"
		if _, pass, ok := r.BasicAuth(); push && password != "" && (!ok || pass != password) {
			w.Header().Set("WWW-Authenticate", `Basic realm="git"`)
			http.Error(w, "credentials, please", http.StatusUnauthorized)
			return
		}
		if r.ContentLength < 0 {
			// net/http/cgi refuses a chunked body (git's large pushes)
			// with 400: give it the length.
			b, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, "reading the body: "+err.Error(), http.StatusBadRequest)
				return
			}
			r.Body, r.ContentLength, r.TransferEncoding = io.NopCloser(bytes.NewReader(b)), int64(len(b)), nil
		}
		backend.ServeHTTP(w, r)
	})
}
