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

func (p *Proxy) postStreamable(w http.ResponseWriter, r *http.Request, e *serverEntry) {
	jsonOK, sseOK := accepts(r)
	if !jsonOK && !sseOK {
		httpError(w, http.StatusNotAcceptable, "Accept must list application/json and text/event-stream")
		return
	}
	msgs, batch, ok := p.readBody(w, r)
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
// response takes longer than the keep-alive interval).
func (p *Proxy) deliver(w http.ResponseWriter, r *http.Request, s *session, ex *exchange, n int, batch, jsonOK, sseOK bool) {
	var (
		stream *sseStream
		held   [][]byte // responses held for a JSON answer
		got    int
	)
	startStream := func() error {
		stream = startSSE(w)
		for _, raw := range held {
			if err := stream.event("message", raw); err != nil {
				return err
			}
		}
		held = nil
		return nil
	}
	keep := time.NewTicker(p.opts.KeepAlive)
	defer keep.Stop()
	for got < n {
		select {
		case <-ex.box.ready:
		case <-keep.C:
			if !sseOK {
				continue
			}
			if stream == nil {
				if err := startStream(); err != nil {
					s.abandon(ex)
					return
				}
			}
			if err := stream.keepAlive(); err != nil {
				s.abandon(ex)
				return
			}
			continue
		case <-r.Context().Done():
			s.abandon(ex)
			return
		}
		items, closed := ex.box.take()
		for _, it := range items {
			if it.response {
				got++
			}
			if stream == nil && (!it.response || !jsonOK) {
				if err := startStream(); err != nil {
					s.abandon(ex)
					return
				}
			}
			if stream == nil {
				held = append(held, it.raw)
			} else if err := stream.event("message", it.raw); err != nil {
				s.abandon(ex)
				return
			}
		}
		if closed {
			break
		}
	}
	if got < n { // the exchange was closed early: this client was not keeping up
		s.abandon(ex)
	}
	if stream != nil {
		return // the stream ends with the handler
	}
	if len(held) == 0 {
		httpError(w, http.StatusInternalServerError, "the response stream broke off before the server answered")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	var body []byte
	if batch {
		body = append(append([]byte{'['}, bytes.Join(held, []byte{','})...), ']')
	} else {
		body = held[0]
	}
	_, _ = w.Write(append(body, '\n'))
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
