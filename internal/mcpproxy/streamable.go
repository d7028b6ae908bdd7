package mcpproxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"time"
)

// MCP Streamable HTTP: POST sends messages, GET opens the server-to-client
// stream, DELETE ends the session.
func (p *Proxy) serveStreamable(w http.ResponseWriter, r *http.Request, e *serverEntry) {
	switch r.Method {
	case http.MethodPost:
		p.postStreamable(w, r, e)
	case http.MethodGet:
		p.getStreamable(w, r, e)
	case http.MethodDelete:
		p.deleteStreamable(w, r, e)
	default:
		w.Header().Set("Allow", "GET, POST, DELETE, OPTIONS")
		httpError(w, http.StatusMethodNotAllowed, "method not allowed: the MCP endpoint takes POST, GET and DELETE")
	}
}

// readPost reads a Streamable HTTP POST: the response types it accepts and
// its messages. It answers the error itself when it fails.
func (p *Proxy) readPost(w http.ResponseWriter, r *http.Request) (msgs []message, batch, jsonOK, sseOK, ok bool) {
	jsonOK, sseOK = accepts(r)
	if !jsonOK && !sseOK {
		httpError(w, http.StatusNotAcceptable, "Accept must list application/json and text/event-stream")
		return nil, false, false, false, false
	}
	msgs, batch, ok = p.readBody(w, r)
	return msgs, batch, jsonOK, sseOK, ok
}

func (p *Proxy) postStreamable(w http.ResponseWriter, r *http.Request, e *serverEntry) {
	msgs, batch, jsonOK, sseOK, ok := p.readPost(w, r)
	if !ok {
		return
	}
	s, ok := p.postSession(w, r, e, msgs, batch)
	if !ok {
		return
	}
	s.begin()
	defer s.finish()

	reqs := requests(msgs)
	var firstID json.RawMessage
	if len(reqs) == 1 && !batch {
		firstID = reqs[0].rawID
	}
	if len(reqs) == 0 { // notifications and responses only
		if err := s.send(msgs); err != nil {
			p.sessionError(w, e, nil, err)
			return
		}
		w.WriteHeader(http.StatusAccepted)
		return
	}
	ex, err := s.register(reqs, sseOK)
	if err != nil {
		p.sessionError(w, e, firstID, err)
		return
	}
	if err := s.send(msgs); errors.Is(err, errServerStalled) {
		s.abandon(ex)
		p.sessionError(w, e, firstID, err)
		return
	} // any other failure means the session is ending, which answers ex
	p.deliver(w, r, s, ex, len(reqs), batch, jsonOK, sseOK)
}

// postSession finds the session a POST belongs to, or starts one for an
// initialize request. It answers the error itself when there is none.
func (p *Proxy) postSession(w http.ResponseWriter, r *http.Request, e *serverEntry, msgs []message, batch bool) (*session, bool) {
	sid := r.Header.Get(hdrSessionID)
	var init *message
	for i := range msgs {
		if msgs[i].kind == kindRequest && msgs[i].method == "initialize" {
			init = &msgs[i]
		}
	}
	if init == nil {
		return p.headerSession(w, r, e)
	}
	switch {
	case batch || len(msgs) > 1:
		httpError(w, http.StatusBadRequest, "initialize must be sent on its own, not in a batch")
		return nil, false
	case sid != "":
		httpError(w, http.StatusBadRequest, "initialize starts a new session, so it must be sent without "+hdrSessionID)
		return nil, false
	}
	s, err := p.newSession(e, streamableHTTP)
	if err != nil {
		p.sessionError(w, e, init.rawID, err)
		return nil, false
	}
	w.Header().Set(hdrSessionID, s.id)
	return s, true
}

// deliver answers a POST that carried requests: with one JSON body when the
// responses come alone, or as an SSE stream when the server sends related
// requests or notifications first (or the client accepts only SSE, or a
// response takes longer than the keep-alive interval). It reports whether
// the client got all n responses.
func (p *Proxy) deliver(w http.ResponseWriter, r *http.Request, s *session, ex *exchange, n int, batch, jsonOK, sseOK bool) bool {
	rep := &reply{w: w, jsonOK: jsonOK}
	keep := time.NewTicker(p.opts.KeepAlive)
	defer keep.Stop()
	for rep.responses < n {
		select {
		case <-ex.box.ready:
		case <-keep.C:
			if sseOK && rep.keepAlive() != nil {
				s.abandon(ex)
				return false
			}
			continue
		case <-r.Context().Done():
			s.abandon(ex)
			return false
		}
		items, closed := ex.box.take()
		for _, it := range items {
			if err := rep.add(it); err != nil {
				s.abandon(ex)
				return false
			}
		}
		if closed {
			break
		}
	}
	if rep.responses < n { // the exchange was closed early: this client was not keeping up
		s.abandon(ex)
	}
	rep.finish(batch)
	return rep.responses >= n
}

// reply is the answer to one POST: held back as JSON until something forces
// an SSE stream.
type reply struct {
	w         http.ResponseWriter
	jsonOK    bool
	stream    *sseStream // once started
	held      [][]byte   // responses held for a JSON answer
	responses int
}

func (rp *reply) add(it item) error {
	if it.response {
		rp.responses++
	}
	if rp.stream == nil && (!it.response || !rp.jsonOK) {
		if err := rp.startStream(); err != nil {
			return err
		}
	}
	if rp.stream == nil {
		rp.held = append(rp.held, it.raw)
		return nil
	}
	return rp.stream.event("message", it.raw)
}

func (rp *reply) startStream() error {
	rp.stream = startSSE(rp.w)
	for _, raw := range rp.held {
		if err := rp.stream.event("message", raw); err != nil {
			return err
		}
	}
	rp.held = nil
	return nil
}

func (rp *reply) keepAlive() error {
	if rp.stream == nil {
		if err := rp.startStream(); err != nil {
			return err
		}
	}
	return rp.stream.keepAlive()
}

// finish ends a stream (by returning) or writes the JSON answer.
func (rp *reply) finish(batch bool) {
	if rp.stream != nil {
		return
	}
	if len(rp.held) == 0 {
		httpError(rp.w, http.StatusInternalServerError, "the response stream broke off before the server answered")
		return
	}
	body := rp.held[0]
	if batch {
		body = append(append([]byte{'['}, bytes.Join(rp.held, []byte{','})...), ']')
	}
	writeJSON(rp.w, body)
}

func (p *Proxy) getStreamable(w http.ResponseWriter, r *http.Request, e *serverEntry) {
	if _, sseOK := accepts(r); !sseOK {
		httpError(w, http.StatusNotAcceptable, "Accept must list text/event-stream to open the server's stream")
		return
	}
	s, ok := p.headerSession(w, r, e)
	if !ok {
		return
	}
	s.begin()
	defer s.finish()
	box, err := s.openGeneral()
	switch {
	case errors.Is(err, errStreamExists):
		httpError(w, http.StatusConflict, "a GET stream is already open for this session; the server sends each message on one stream only")
		return
	case err != nil:
		p.sessionError(w, e, nil, err)
		return
	}
	p.pump(r, startSSE(w), box)
	s.closeGeneral(box)
}

func (p *Proxy) deleteStreamable(w http.ResponseWriter, r *http.Request, e *serverEntry) {
	s, ok := p.headerSession(w, r, e)
	if !ok {
		return
	}
	s.end("the client ended the session")
	w.WriteHeader(http.StatusNoContent)
}

func (p *Proxy) headerSession(w http.ResponseWriter, r *http.Request, e *serverEntry) (*session, bool) {
	sid := r.Header.Get(hdrSessionID)
	if sid == "" {
		httpError(w, http.StatusBadRequest, "missing "+hdrSessionID+" header (hint: start a session with an initialize request)")
		return nil, false
	}
	s := p.lookup(sid, e, streamableHTTP)
	if s == nil {
		httpError(w, http.StatusNotFound, "session not found or ended (hint: start a new session with initialize)")
		return nil, false
	}
	return s, true
}

// pump writes what arrives in box as SSE "message" events until box closes,
// the client goes away or a write fails.
func (p *Proxy) pump(r *http.Request, stream *sseStream, box *mailbox) {
	keep := time.NewTicker(p.opts.KeepAlive)
	defer keep.Stop()
	for {
		items, closed := box.take()
		for _, it := range items {
			if err := stream.event("message", it.raw); err != nil {
				return
			}
		}
		if closed {
			return
		}
		select {
		case <-box.ready:
		case <-keep.C:
			if stream.keepAlive() != nil {
				return
			}
		case <-r.Context().Done():
			return
		}
	}
}
