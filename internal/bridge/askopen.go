package bridge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/termsafe"
)

// The guest's end of the URL opener (the protocol is openurl.go's): what
// `agent-vm open-url` runs in the guest for xdg-open and $BROWSER.

// ErrNoOpener is AskOpen's error when the guest has no URL opener: the
// host has not opened it for this VM.
var ErrNoOpener = errors.New("the URL opener is closed")

// Answer is the host's answer to one URL.
type Answer struct {
	// Opened: the host opened the URL with its opener. Neither Opened nor
	// Refused: the host showed it to its user without opening it.
	Opened bool
	// Refused is why the host refused the URL; empty when it did not.
	Refused string
}

// String says what the answer means, for the guest's user.
func (a Answer) String() string {
	switch {
	case a.Refused != "":
		return "the host refused the URL: " + a.Refused
	case a.Opened:
		return "opened in the host's browser"
	default:
		return "shown on the host, not opened (opening is not allowed, or the host has no browser to open it)"
	}
}

// AskOpen is the guest's end of the URL opener: it asks the host at socket
// (empty: guest.OpenURLSocket) to open rawURL and returns its answer. A missing
// socket, or one nobody serves, is ErrNoOpener. Only what would break
// the protocol's line is refused here; the host checks the rest.
func AskOpen(ctx context.Context, socket, rawURL string) (Answer, error) {
	if len(rawURL) > MaxURL {
		return Answer{}, fmt.Errorf("the URL is %d bytes long, more than the %d the host reads", len(rawURL), MaxURL)
	}
	if strings.ContainsAny(rawURL, "\r\n") {
		return Answer{}, errors.New("the URL contains a line break")
	}
	if socket == "" {
		socket = guest.OpenURLSocket
	}
	var dialer net.Dialer
	c, err := dialer.DialContext(ctx, "unix", socket)
	if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
		return Answer{}, fmt.Errorf("%w: %v", ErrNoOpener, err)
	}
	if err != nil {
		return Answer{}, fmt.Errorf("reaching the host's URL opener: %w", err)
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	if _, err := io.WriteString(c, rawURL+"\n"); err != nil {
		return Answer{}, fmt.Errorf("asking the host to open the URL: %w", err)
	}
	line, err := io.ReadAll(io.LimitReader(c, 4<<10))
	if ctx.Err() != nil {
		return Answer{}, fmt.Errorf("the host did not answer: %w", ctx.Err())
	}
	if err != nil {
		return Answer{}, fmt.Errorf("reading the host's answer: %w", err)
	}
	return parseAnswer(string(line))
}

// parseAnswer reads the host's answer line.
func parseAnswer(line string) (Answer, error) {
	line, _, _ = strings.Cut(line, "\n")
	switch {
	case line == answerOpened:
		return Answer{Opened: true}, nil
	case line == answerPrinted:
		return Answer{}, nil
	case strings.HasPrefix(line, refusedPrefix):
		return Answer{Refused: termsafe.Line(strings.TrimPrefix(line, refusedPrefix))}, nil
	case line == "":
		return Answer{}, errors.New("the host closed the URL opener without an answer")
	default:
		return Answer{}, fmt.Errorf("the host's answer %q is not one of the URL opener's", termsafe.Line(line))
	}
}
