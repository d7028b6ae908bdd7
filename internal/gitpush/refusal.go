package gitpush

import (
	"errors"
	"net/http"
	"strings"
)

// Side-band channels (gitprotocol-pack.txt): the data itself, progress
// and messages git prints as "remote: …", and a fatal error.
const (
	bandData     = 1
	bandProgress = 2
)

// WriteRefusal answers a refused push as receive-pack itself answers one
// a pre-receive hook declined: HTTP 200, every line of err's message on
// the side-band git prints as "remote: …", and a report-status with
// "unpack ok" and "ng <ref> <reason>" for each update of push, the reason
// a *RefusedError gives that ref, else err's message. Through it git
// 2.39 prints (the test TestPushThroughGuard shows it):
//
//	remote: push refused: refs/heads/main: this VM may push only to its own branch "feat", not "main" (hint: git push origin HEAD:feat)
//	To http://127.0.0.1:42271/remote.git
//	 ! [remote rejected] HEAD -> main (this VM may push only to its own branch "feat", not "main" (hint: git push origin HEAD:feat))
//	error: failed to push some refs to 'http://127.0.0.1:42271/remote.git'
//
// and exits 1. An HTTP 403 with a text/plain body, which git shows when
// it discovers the refs, is not shown for the push itself: git prints
// only "error: RPC failed; HTTP 403 curl 22 The requested URL returned
// error: 403" and "fatal: the remote end hung up unexpectedly". That 403
// is still the answer when the client did not ask for report-status: it
// would read no report and take the silence for success.
//
// Drain the request body first (io.Copy(io.Discard, replay)): git sends
// the whole pack before it reads the answer, and net/http closes a
// connection whose request body is left unread past a small amount, which
// git would report as a broken RPC instead of the message.
func WriteRefusal(w http.ResponseWriter, push Push, err error) {
	msg := err.Error()
	if !push.Has("report-status") && !push.Has("report-status-v2") && len(push.Updates) > 0 {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write([]byte(msg + "\n"))
		return
	}
	var refused *RefusedError
	errors.As(err, &refused)
	report := appendPkt(nil, []byte("unpack ok\n"))
	for _, u := range push.Updates {
		reason := msg
		if refused != nil {
			reason = "refused: another ref of this push is not allowed"
			for _, r := range refused.Refs {
				if r.Ref == u.Ref {
					reason = r.Reason
				}
			}
		}
		report = appendPkt(report, []byte("ng "+u.Ref+" "+oneLine(reason, maxPktLen-4-len("ng  \n")-len(u.Ref))+"\n"))
	}
	report = append(report, "0000"...)

	var body []byte
	switch {
	case push.Has("side-band-64k"):
		body = sideBand(msg, report, maxPktLen-5)
	case push.Has("side-band"):
		body = sideBand(msg, report, 1000-5)
	default:
		body = report
	}
	w.Header().Set("Content-Type", "application/x-git-receive-pack-result")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}

// sideBand multiplexes msg's lines on the progress band and report on the
// data band, in packets of at most size bytes of data, then a flush-pkt.
func sideBand(msg string, report []byte, size int) []byte {
	var out []byte
	for line := range strings.SplitSeq(msg, "\n") {
		out = appendPkt(out, append([]byte{bandProgress}, oneLine(line, size-1)+"\n"...))
	}
	for len(report) > 0 {
		n := min(len(report), size)
		out = appendPkt(out, append([]byte{bandData}, report[:n]...))
		report = report[n:]
	}
	return append(out, "0000"...)
}

// oneLine makes s one line of at most limit bytes (none if limit < 0):
// control characters (a newline would end the line early, and a message
// reaches a terminal) become spaces.
func oneLine(s string, limit int) string {
	b := []byte(s)
	for i, c := range b {
		if c < 0x20 || c == 0x7f {
			b[i] = ' '
		}
	}
	if len(b) > limit {
		b = b[:max(limit, 0)]
	}
	return string(b)
}
