package mcpproxy

import (
	"fmt"
	"net/http"
	"strings"
)

// The HTTP+SSE transport of 2024-11-05: GET .../sse opens the session and
// its stream, whose first event names the URL to POST messages to.
func (p *Proxy) serveSSE(w http.ResponseWriter, r *http.Request, e *serverEntry) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", "GET, OPTIONS")
		httpError(w, http.StatusMethodNotAllowed, "method not allowed: GET opens the SSE stream")
		return
	}
	if _, sseOK := accepts(r); !sseOK {
		httpError(w, http.StatusNotAcceptable, "Accept must list text/event-stream")
		return
	}
	s, err := p.newSession(e, legacySSE)
	if err != nil {
		p.sessionError(w, e, nil, err)
		return
	}
	s.begin()
	defer s.finish()
	box := s.generalBox()
	stream := startSSE(w)
	endpoint := strings.TrimSuffix(r.URL.Path, "/sse") + "/messages?sessionId=" + s.id
	if box != nil && stream.event("endpoint", []byte(endpoint)) == nil {
		p.pump(r, stream, box)
	}
	s.end("the client closed its SSE stream")
}

func (p *Proxy) serveMessages(w http.ResponseWriter, r *http.Request, e *serverEntry) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST, OPTIONS")
		httpError(w, http.StatusMethodNotAllowed, "method not allowed: POST sends messages")
		return
	}
	sid := r.URL.Query().Get("sessionId")
	if sid == "" {
		httpError(w, http.StatusBadRequest, "missing sessionId query parameter (hint: POST to the URL of the SSE stream's endpoint event)")
		return
	}
	s := p.lookup(sid, e, legacySSE)
	if s == nil {
		httpError(w, http.StatusNotFound, "session not found or ended (hint: open a new SSE stream)")
		return
	}
	msgs, _, ok := p.readBody(w, r)
	if !ok {
		return
	}
	s.begin()
	defer s.finish()
	if err := s.registerLegacy(requests(msgs)); err != nil {
		p.sessionError(w, e, nil, err)
		return
	}
	if err := s.send(msgs); err != nil {
		p.sessionError(w, e, nil, err)
		return
	}
	w.WriteHeader(http.StatusAccepted)
	fmt.Fprintln(w, "Accepted")
}
