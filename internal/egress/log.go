package egress

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agent-vm/agent-vm/internal/termsafe"
)

// LogEntry is one connection in the log.
type LogEntry struct {
	Time time.Time `json:"time"`
	// Kind is "connect" (an HTTP CONNECT tunnel), "http" (a plain HTTP request),
	// "https" (a request in a tunnel the proxy intercepts to put secrets in:
	// Interceptor), KindExposedPort (a host port the user exposed) or KindOpenURL
	// (a URL the guest asked the host to open, which no connection of the guest's
	// carries: Host and Port are the URL's, URL what of it the log keeps, Rule
	// the verdict, and no bytes) or KindDevTools (a DevTools call the browser
	// bridge refused: Request is its method, URL and Host the URL it would have
	// loaded, if any, Rule the reason).
	Kind    string `json:"kind"`
	Host    string `json:"host"`
	Port    int    `json:"port"`
	Allowed bool   `json:"allowed"`
	Rule    string `json:"rule"`
	// BytesOut went from the guest to the destination, BytesIn back.
	BytesOut int64 `json:"bytes_out"`
	BytesIn  int64 `json:"bytes_in"`
	// Error is why an allowed connection failed (resolving, dialling).
	Error string `json:"error,omitempty"`
	// Refused are the destination's addresses the proxy refused (Judge):
	// all of them when Rule is RuleAddresses; some, beside Error's dial
	// failures, when the others could not be reached.
	Refused []Refusal `json:"refused,omitempty"`
	// Request is an intercepted request's method and path (no query).
	Request string `json:"request,omitempty"`
	// Secrets are the names of the secrets put into an intercepted
	// request (never their values).
	Secrets []string `json:"secrets,omitempty"`
	// Scrubbed are the names of the secrets whose values the proxy took
	// out of an intercepted request's answer: the server sent back what
	// the request carried.
	Scrubbed []string `json:"scrubbed,omitempty"`
	// URL is a KindOpenURL entry's URL as scheme://host/path: no user
	// name or password, no query and no fragment, which carry login
	// codes and tokens (as Request keeps no query).
	URL string `json:"url,omitempty"`
	// Ask is the ID of the ask that held the connection for the user's
	// answer (mode ask); Rule says how it ended.
	Ask int `json:"ask,omitempty"`
}

// Line is the entry as `net log` prints it, one line escaped for a
// terminal (termsafe: hosts, URLs and requests come from the guest): the
// local time, the kind, the verdict, the destination, the rule and bytes
// each way, and what the entry has besides.
func (x LogEntry) Line() string {
	verdict := "allowed"
	if !x.Allowed {
		verdict = "DENIED"
	}
	when := x.Time.Local().Format(time.DateTime)
	switch x.Kind {
	case KindDevTools:
		// No connection: a DevTools call the DevTools relay refused, the
		// URL it would have loaded and the reason.
		line := fmt.Sprintf("%s  %-8s %-7s %s", when, x.Kind, verdict, termsafe.String(x.Request))
		if x.URL != "" {
			line += " " + termsafe.String(x.URL)
		}
		return fmt.Sprintf("%s  (%s)", line, termsafe.String(x.Rule))
	case KindOpenURL:
		// No connection: the URL the guest asked the host to open (of a
		// refused one, what was kept of it) and the verdict.
		return fmt.Sprintf("%s  %-7s %-7s %s  (%s)", when, x.Kind, verdict, termsafe.String(cmp.Or(x.URL, "-")), termsafe.String(x.Rule))
	}
	line := fmt.Sprintf("%s  %-7s %-7s %s:%d  (%s)  out %d B, in %d B", when, x.Kind, verdict,
		termsafe.String(x.Host), x.Port, termsafe.String(x.Rule), x.BytesOut, x.BytesIn)
	for _, part := range []struct{ label, text string }{
		{"", x.Request},
		{"secrets: ", strings.Join(x.Secrets, ", ")},
		{"scrubbed from the answer: ", strings.Join(x.Scrubbed, ", ")},
		{"error: ", x.Error},
	} {
		if part.text != "" {
			line += "  " + part.label + termsafe.String(part.text)
		}
	}
	return line
}

// KindOpenURL is the Kind of a URL the guest asked the host to open
// (internal/bridge writes these into the VM's log beside the proxy).
const KindOpenURL = "open-url"

// KindExposedPort is the Kind of a connection to a host port the user
// exposed (`agent-vm port expose`), through the proxy.
const KindExposedPort = "exposed-port"

// KindDevTools is the Kind of a DevTools call the host's browser bridge
// refused (internal/bridge's relay writes these).
const KindDevTools = "devtools"

// DefaultLogLimit bounds the log: past it, the file is rotated to
// "<path>.1" (the one older file kept), so the log takes at most twice it.
const DefaultLogLimit = 1 << 20

// Log appends entries to a size-bounded JSON-lines file (0600), Name in
// Dir (opened once, so the proxy keeps reaching it after it drops its
// privileges: see the package doc). Other processes may append to the same
// file (the URL opener, internal/bridge): each entry is one O_APPEND write, so
// lines never interleave; two rotating at once can lose the older file.
type Log struct {
	Dir   *os.Root
	Name  string
	Limit int64

	mu sync.Mutex
}

// Add appends one entry; a failure to write is returned, never fatal to
// the connection.
func (l *Log) Add(e LogEntry) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	limit := l.Limit
	if limit <= 0 {
		limit = DefaultLogLimit
	}
	if fi, err := l.Dir.Stat(l.Name); err == nil && fi.Size()+int64(len(b)) >= limit {
		if err := l.Dir.Rename(l.Name, l.Name+".1"); err != nil {
			return err
		}
	}
	f, err := l.Dir.OpenFile(l.Name, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(append(b, '\n'))
	return errors.Join(err, f.Close(), l.keepOwner())
}

// keepOwner gives the file the owner of its directory when this process
// is root (the URL opener's holder): the VM's proxy, which runs as the
// workspace's owner, appends to and rotates the same file, and a file of
// root's that a write here made or rotated would shut it out.
func (l *Log) keepOwner() error {
	if os.Geteuid() != 0 {
		return nil
	}
	dir, err := l.Dir.Stat(".")
	if err != nil {
		return err
	}
	st, ok := dir.Sys().(*syscall.Stat_t)
	if !ok || st.Uid == 0 {
		return nil
	}
	return l.Dir.Lchown(l.Name, int(st.Uid), int(st.Gid))
}

// ReadLog returns the entries of the log at path, oldest first (the rotated
// file, then the current one). A missing log has no entries.
func ReadLog(path string) ([]LogEntry, error) {
	var out []LogEntry
	for _, p := range []string{path + ".1", path} {
		b, err := os.ReadFile(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, parseLines(b)...)
	}
	return out, nil
}

// parseLines decodes complete JSON lines, skipping any it cannot read (a
// line cut by a crash).
func parseLines(b []byte) []LogEntry {
	var out []LogEntry
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var e LogEntry
		if json.Unmarshal(sc.Bytes(), &e) == nil {
			out = append(out, e)
		}
	}
	return out
}

// Follow calls emit for each entry the log gains after offset bytes of the
// current file (pass the size ReadLog saw, or 0), until ctx ends. It
// notices a rotation and reads the new file from its start.
func Follow(ctx context.Context, path string, offset int64, emit func(LogEntry) error) error {
	var partial []byte
	for {
		fi, err := os.Stat(path)
		switch {
		case err == nil && fi.Size() < offset:
			offset, partial = 0, nil // rotated
		case err == nil && fi.Size() > offset:
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			b, err := io.ReadAll(io.NewSectionReader(f, offset, fi.Size()-offset))
			f.Close()
			if err != nil {
				return err
			}
			offset += int64(len(b))
			b = append(partial, b...)
			end := bytes.LastIndexByte(b, '\n') + 1
			partial = append([]byte(nil), b[end:]...)
			for _, e := range parseLines(b[:end]) {
				if err := emit(e); err != nil {
					return err
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(250 * time.Millisecond):
		}
	}
}
