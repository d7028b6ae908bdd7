package mcpproxy

import (
	"net/http"
	"time"
)

// sseWriteTimeout bounds writing one batch of events: a client that stops
// reading loses its stream instead of pinning a handler forever.
const sseWriteTimeout = 30 * time.Second

// sseStream writes Server-Sent Events.
type sseStream struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func startSSE(w http.ResponseWriter) *sseStream {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache, no-transform")
	h.Set("X-Accel-Buffering", "no") // tell buffering reverse proxies to pass events through
	w.WriteHeader(http.StatusOK)
	s := &sseStream{w: w, rc: http.NewResponseController(w)}
	_ = s.rc.Flush()
	return s
}

// event writes one event; data must not contain line breaks (compact JSON
// does not).
func (s *sseStream) event(name string, data []byte) error {
	_ = s.rc.SetWriteDeadline(time.Now().Add(sseWriteTimeout))
	buf := make([]byte, 0, len(name)+len(data)+18)
	buf = append(buf, "event: "...)
	buf = append(buf, name...)
	buf = append(buf, "\ndata: "...)
	buf = append(buf, data...)
	buf = append(buf, "\n\n"...)
	if _, err := s.w.Write(buf); err != nil {
		return err
	}
	return s.rc.Flush()
}

// keepAlive writes an SSE comment, which clients ignore; it keeps idle
// connections open through middleboxes and finds clients that are gone.
func (s *sseStream) keepAlive() error {
	_ = s.rc.SetWriteDeadline(time.Now().Add(sseWriteTimeout))
	if _, err := s.w.Write([]byte(": keep-alive\n\n")); err != nil {
		return err
	}
	return s.rc.Flush()
}
