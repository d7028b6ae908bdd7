package mcpproxy

import (
	"io"
	"os"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// The stdin writer drains what is queued when the mailbox closes, then
// ends: a close that arrives while it is taking the queued lines must not
// leave it waiting for a wake-up that never comes (it did: stop then hung
// on the pipe goroutines, and the leak check saw it under load).
func TestStdinWriterEndsWhenClosedWithLinesQueued(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	c := &child{log: hclog.NewNullLogger(), stdinW: w, in: newMailbox(1 << 20)}
	// The interleaving: a writer parked on ready is woken by a line (the
	// one token), the close comes before it takes (its token is dropped,
	// one is pending), and it takes the line and the close together.
	if err := c.send([]byte(`{"jsonrpc":"2.0","method":"a"}`)); err != nil {
		t.Fatal(err)
	}
	c.in.close()
	<-c.in.ready // the wake-up the parked writer consumed
	c.io.Add(1)
	done := make(chan struct{})
	go func() { c.writeStdin(); close(done) }()
	read := make(chan []byte)
	go func() { b, _ := io.ReadAll(r); read <- b }() // EOF once the writer closed stdin
	select {
	case <-done:
	case <-time.After(30 * time.Second): // a deadlock detector, not a timing check
		w.Close()
		t.Fatal("the stdin writer never ended after its mailbox closed")
	}
	if got := string(<-read); got != `{"jsonrpc":"2.0","method":"a"}`+"\n" {
		t.Errorf("the server got %q", got)
	}
}
