package tcpfwd

import (
	"bufio"
	"context"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

// echo serves on 127.0.0.1 a line-echo that prefixes what it got with
// tag, and returns its address.
func echo(t *testing.T, tag string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				line, _ := bufio.NewReader(c).ReadString('\n')
				io.WriteString(c, tag+line)
			}()
		}
	}()
	return l.Addr().String()
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func roundTrip(t *testing.T, port int, msg string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, msg+"\n")
	b, _ := io.ReadAll(c)
	return string(b)
}

// Each rule carries its own port's connections to its own destination,
// a half close passed on; when ctx ends the listeners close.
func TestForwardsEachPortToItsDestination(t *testing.T) {
	a, b := echo(t, "a:"), echo(t, "b:")
	pa, pb := freePort(t), freePort(t)
	f, err := Listen([]Rule{{Port: pa, To: a}, {Port: pb, To: b}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Serve(ctx, nil) }()
	if got := roundTrip(t, pa, "one"); got != "a:one\n" {
		t.Errorf("through %d: %q", pa, got)
	}
	if got := roundTrip(t, pb, "two"); got != "b:two\n" {
		t.Errorf("through %d: %q", pb, got)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Serve: %v", err)
	}
	if _, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(pa), time.Second); err == nil {
		t.Errorf("127.0.0.1:%d still listens after Serve ended", pa)
	}
}

// A port another program holds fails Listen, naming it, and none of the
// rules' ports is left open.
func TestListenIsAllOrNothing(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	hp := held.Addr().(*net.TCPAddr).Port
	free := freePort(t)
	_, err = Listen([]Rule{{Port: free, To: "127.0.0.1:1"}, {Port: hp, To: "127.0.0.1:1"}})
	if err == nil || !strings.Contains(err.Error(), "127.0.0.1:"+strconv.Itoa(hp)) || !strings.Contains(err.Error(), "hint:") {
		t.Fatalf("Listen with a held port: %v", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(free))
	if err != nil {
		t.Errorf("port %d was left open by the failed Listen: %v", free, err)
	} else {
		l.Close()
	}
}

// A destination that does not answer closes the client's connection.
func TestUnreachableDestinationClosesTheClient(t *testing.T) {
	dead := freePort(t) // nothing listens there
	p := freePort(t)
	f, err := Listen([]Rule{{Port: p, To: "127.0.0.1:" + strconv.Itoa(dead)}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go f.Serve(ctx, nil)
	if got := roundTrip(t, p, "x"); got != "" {
		t.Errorf("got %q from a dead destination", got)
	}
}

func TestParseRule(t *testing.T) {
	r, err := ParseRule("2222=10.213.0.2:22")
	if err != nil || r != (Rule{Port: 2222, To: "10.213.0.2:22"}) || r.String() != "2222=10.213.0.2:22" {
		t.Errorf("ParseRule: %+v %v", r, err)
	}
	for _, bad := range []string{"", "2222", "2222=", "x=1.2.3.4:5", "0=1.2.3.4:5", "70000=1.2.3.4:5", "2222=1.2.3.4"} {
		if _, err := ParseRule(bad); err == nil {
			t.Errorf("ParseRule(%q) took it", bad)
		}
	}
}
