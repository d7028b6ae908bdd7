package egress

import (
	"bufio"
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"
)

// Mode ask holds a connection the policy refuses only for not being on
// the allow-list (Decision.Ask) while the user is asked. The proxy and
// agent-vm's commands meet in the VM's network directory, which the proxy
// owns and reaches after dropping its privileges:
//
//   - AsksFile, which the proxy rewrites whenever an ask begins or ends:
//     the asks pending (`net pending` reads it);
//   - AnswersFile, which `net approve|deny` writes under the VM's lock:
//     the user's answers, each tied by its Token to one ask of this proxy
//     (an ID alone could name an ask of an earlier proxy of the same VM).
//
// A held connection goes through when its ask is approved or the policy
// comes to allow its destination (`net allow`, `net approve --always`). It
// is refused when its ask is refused, when the policy comes to refuse it
// for another reason (`net deny`, another mode), when the policy's AskWait
// passes unanswered, when more than MaxAsks are pending (the oldest
// first), and when the guest closes it. Each outcome is the rule of the
// connection's log entry, which carries the ask's ID.
const (
	AsksFile    = "asks.json"
	AnswersFile = "answers.json"
	// DefaultAskWait and MaxAskWait bound how long, in seconds, an ask
	// holds its connection (Policy.AskWait).
	DefaultAskWait = 60
	MaxAskWait     = 600
	// MaxAsks bounds the asks pending at once: a guest that opens many
	// connections to unlisted names holds no more than this many
	// connections, and asks the user no more than this many questions.
	MaxAsks = 16
	askPoll = 200 * time.Millisecond
)

// Ask is a connection the proxy holds for the user's answer.
type Ask struct {
	ID    int       `json:"id"`    // what the user types: net approve ID
	Token string    `json:"token"` // what an answer names (Answer)
	Time  time.Time `json:"time"`
	Until time.Time `json:"until"` // refused then, unanswered
	Kind  string    `json:"kind"`  // connect or http, as the log's
	Host  string    `json:"host"`
	Port  int       `json:"port"`
	// Method is CONNECT, or a plain HTTP request's method; Path is the
	// latter's path, without its query (as the log keeps requests).
	Method string `json:"method"`
	Path   string `json:"path,omitempty"`
}

// Answer is the user's answer to one ask.
type Answer struct {
	ID    int    `json:"id"`
	Token string `json:"token"`
	Allow bool   `json:"allow"`
	// Always: the user changed the policy for the ask's host too (net
	// approve|deny --always), which the log entry's rule says.
	Always bool `json:"always,omitempty"`
}

// AskTimeout is how long mode ask holds a connection under p.
func (p Policy) AskTimeout() time.Duration {
	return time.Duration(min(cmp.Or(p.AskWait, DefaultAskWait), MaxAskWait)) * time.Second
}

// asker is a proxy's pending asks and the answers it has read.
type asker struct {
	mu      sync.Mutex
	next    int
	pending []*held
	stamp   time.Time // AnswersFile's modification time when read
	answers []Answer
}

type held struct {
	Ask
	evicted chan struct{} // closed when a newer ask pushed this one out
}

// ask holds the connection c, whose request req the proxy's policy pol
// refused with d (d.Ask), until the user or the policy decides, and
// returns the decision. br is c's reader: the guest's closing it ends the
// ask, and what the guest sends meanwhile stays in it.
func (p *Proxy) ask(c net.Conn, br *bufio.Reader, req *http.Request, e *LogEntry, pol Policy) Decision {
	wait := pol.AskTimeout()
	a := Ask{Time: time.Now().UTC(), Kind: e.Kind, Host: e.Host, Port: e.Port, Method: req.Method}
	a.Until = a.Time.Add(wait)
	if req.Method != http.MethodConnect {
		a.Path = req.URL.Path
	}
	h := p.asks.add(a)
	e.Ask = h.ID
	p.writeAsks()
	defer func() {
		p.asks.remove(h)
		p.writeAsks()
	}()
	if p.Logger != nil {
		p.Logger.Info("asking the user", "ask", h.ID, "host", e.Host, "port", e.Port)
	}
	gone, stop := watchGuest(c, br)
	defer stop()
	tick := time.NewTicker(askPoll)
	defer tick.Stop()
	timeout := time.NewTimer(wait)
	defer timeout.Stop()
	for {
		select {
		case <-h.evicted:
			return Decision{Rule: fmt.Sprintf("refused unanswered, more than %d asks were pending (ask %d)", MaxAsks, h.ID)}
		case <-timeout.C:
			return Decision{Rule: fmt.Sprintf("no answer within %d s (ask %d)", int(wait.Seconds()), h.ID)}
		case <-gone:
			return Decision{Rule: fmt.Sprintf("the guest closed the connection before an answer (ask %d)", h.ID)}
		case <-tick.C:
		}
		if an, ok := p.answerTo(h.Token); ok {
			return answered(h.ID, an)
		}
		if d, _ := p.decide(e.Host); d.Allowed || !d.Ask {
			d.Rule += fmt.Sprintf(" (ask %d: the policy changed while asking)", h.ID)
			return d
		}
	}
}

// answered is the decision an answer makes.
func answered(id int, an Answer) Decision {
	switch {
	case an.Allow && an.Always:
		return Decision{Allowed: true, Rule: fmt.Sprintf("approved by the user, and allowed from now on (ask %d)", id)}
	case an.Allow:
		return Decision{Allowed: true, Rule: fmt.Sprintf("approved by the user, this once (ask %d)", id)}
	case an.Always:
		return Decision{Rule: fmt.Sprintf("refused by the user, and denied from now on (ask %d)", id)}
	}
	return Decision{Rule: fmt.Sprintf("refused by the user (ask %d)", id)}
}

// watchGuest reports on gone when the guest closes c while an ask holds
// it. stop ends the watch, leaving c as it was and in br whatever the
// guest sent.
func watchGuest(c net.Conn, br *bufio.Reader) (gone <-chan struct{}, stop func()) {
	ch, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		if _, err := br.Peek(1); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			close(ch)
		}
	}()
	return ch, func() {
		_ = c.SetReadDeadline(time.Unix(1, 0))
		<-done
		_ = c.SetReadDeadline(time.Time{})
	}
}

// add makes a an ask, pending, with the next ID and a token of its own;
// when MaxAsks are pending, the oldest is refused.
func (k *asker) add(a Ask) *held {
	var tok [8]byte
	_, _ = rand.Read(tok[:])
	k.mu.Lock()
	defer k.mu.Unlock()
	k.next++
	a.ID, a.Token = k.next, hex.EncodeToString(tok[:])
	h := &held{Ask: a, evicted: make(chan struct{})}
	if len(k.pending) >= MaxAsks {
		close(k.pending[0].evicted)
		k.pending = k.pending[1:]
	}
	k.pending = append(k.pending, h)
	return h
}

func (k *asker) remove(h *held) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.pending = slices.DeleteFunc(k.pending, func(x *held) bool { return x == h })
}

// writeAsks rewrites AsksFile with the asks pending. A failure is logged:
// the asks still end by the policy, the timeout or the guest.
func (p *Proxy) writeAsks() {
	p.asks.mu.Lock()
	defer p.asks.mu.Unlock()
	asks := make([]Ask, 0, len(p.asks.pending))
	for _, h := range p.asks.pending {
		asks = append(asks, h.Ask)
	}
	b, err := json.MarshalIndent(asks, "", "  ")
	if err == nil {
		tmp := AsksFile + ".tmp"
		if err = p.Dir.WriteFile(tmp, append(b, '\n'), 0o600); err == nil {
			err = p.Dir.Rename(tmp, AsksFile)
		}
	}
	if err != nil && p.Logger != nil {
		p.Logger.Error("writing the pending asks", "error", err)
	}
}

// answerTo is the user's answer to the ask of token, if there is one:
// AnswersFile is read again when its modification time changes.
func (p *Proxy) answerTo(token string) (Answer, bool) {
	k := &p.asks
	k.mu.Lock()
	defer k.mu.Unlock()
	if fi, err := p.Dir.Stat(AnswersFile); err == nil && !fi.ModTime().Equal(k.stamp) {
		b, err := p.Dir.ReadFile(AnswersFile)
		var as []Answer
		if err == nil {
			err = json.Unmarshal(b, &as)
		}
		if err != nil && p.Logger != nil {
			p.Logger.Error("reading the user's answers", "error", err)
		}
		k.stamp, k.answers = fi.ModTime(), as
	}
	i := slices.IndexFunc(k.answers, func(a Answer) bool { return a.Token == token })
	if i < 0 {
		return Answer{}, false
	}
	return k.answers[i], true
}

// ReadAsks reads the asks pending in the network directory dir: none when
// its proxy has not asked (or does not run).
func ReadAsks(dir string) ([]Ask, error) {
	var asks []Ask
	err := readJSON(dir, AsksFile, &asks)
	return asks, err
}

// ReadAnswers reads the answers in the network directory dir.
func ReadAnswers(dir string) ([]Answer, error) {
	var as []Answer
	err := readJSON(dir, AnswersFile, &as)
	return as, err
}

// WriteAnswers replaces the answers of the network directory dir (0600,
// the directory owner's, who the proxy runs as). The caller holds the VM's
// lock and keeps only the answers to asks still pending.
func WriteAnswers(dir string, as []Answer) error {
	return writeOwned(dir, AnswersFile, as)
}

func readJSON(dir, name string, v any) error {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}
