package idle

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/agentstate"
	"github.com/agent-vm/agent-vm/internal/session"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/testutil"
)

// listen serves on 127.0.0.1 (accepting and holding every connection, as
// QEMU's forwards do) and returns its port.
func listen(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var held []net.Conn
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}

func dial(t *testing.T, port int) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// waitFor polls cond for a few seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// Connections reads the host's real sockets: the listener's side of a
// connection counts, the client's own end does not, nor another port's;
// what a client sends shows in the bytes its connection received. The
// /proc tables, read where sock_diag is not there, find the same
// connections.
func TestConnections(t *testing.T) {
	a, b := listen(t), listen(t)
	if got, err := Connections([]int{a}); err != nil || len(got) != 0 {
		t.Fatalf("before any connection: %v, %v", got, err)
	}
	c := dial(t, a)
	dial(t, a)
	dial(t, b)
	waitFor(t, "two connections to a", func() bool {
		got, _ := Connections([]int{a})
		return len(got) == 2
	})
	got, _ := Connections([]int{a, b, 0})
	n := map[int]int{}
	for _, p := range got {
		n[p.Port]++
	}
	if n[a] != 2 || n[b] != 1 || len(got) != 3 {
		t.Errorf("connections to a and b: %v", got)
	}
	if _, err := c.Write([]byte("GET /health HTTP/1.1\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the request's bytes on a's connection", func() bool {
		now, _ := Connections([]int{a})
		for k, conn := range now {
			if conn.Received == 24 && got[k].Received == 0 {
				return true
			}
		}
		return false
	})
	proc := map[string]Conn{}
	for _, table := range tcpTables {
		if err := readTable(table, map[int]bool{a: true, b: true}, proc); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	if len(proc) != 3 {
		t.Errorf("the /proc tables: %v, want the 3 connections", proc)
	}
	for k, c := range proc {
		if _, ok := got[k]; !ok || c.Counted {
			t.Errorf("the /proc tables have %q (%+v), which sock_diag named otherwise: %v", k, c, got)
		}
	}
	// What the listener's side sends shows once the client acknowledged it.
	s := sending(t, make([]byte, 4096))
	drain(t, dial(t, s))
	waitFor(t, "the bytes a's side sent", func() bool {
		now, _ := Connections([]int{s})
		for _, conn := range now {
			if conn.Counted && conn.Sent >= 8192 && conn.Received == 0 {
				return true
			}
		}
		return false
	})
}

func TestPortsAndArgs(t *testing.T) {
	r := &state.Record{Ports: state.Ports{SSH: 2222, MCP: 8000}, Forwards: []state.Forward{{Guest: 3000, Host: 3001}}}
	if got := Ports(r); len(got) != 3 || got[0] != 2222 || got[1] != 8000 || got[2] != 3001 {
		t.Errorf("Ports: %v", got)
	}
	l := state.Layout{Dir: "/s/agent-vms/feat-x"}
	want := []string{"--state-dir", "/s/agent-vms", "suspend", "--hibernate", "feat-x"}
	if got := Args(l, "suspend", "--hibernate"); len(got) != len(want) || got[2] != "suspend" || got[1] != want[1] || got[4] != want[4] {
		t.Errorf("Args: %q", got)
	}
}

// vm is a VM as a Watch sees it: its sessions, clients, CPU and sleep,
// with what the Watch asked of it.
type vm struct {
	mu         sync.Mutex
	sessions   []session.Info
	channels   int
	cpu        time.Duration
	busy       bool // CPU time grows by a core's worth between looks
	asleep     atomic.Bool
	after      time.Duration
	hibernates atomic.Int32
	wakes      atomic.Int32
	listed     atomic.Int32
}

func (v *vm) watch(ports ...int) *Watch {
	return &Watch{
		After: func() time.Duration { v.mu.Lock(); defer v.mu.Unlock(); return v.after },
		Ports: func() []int { return ports },
		Sessions: func(context.Context) ([]session.Info, error) {
			v.listed.Add(1)
			v.mu.Lock()
			defer v.mu.Unlock()
			return v.sessions, nil
		},
		Held: func() (int, []string) { v.mu.Lock(); defer v.mu.Unlock(); return v.channels, nil },
		CPU: func() (time.Duration, error) {
			v.mu.Lock()
			defer v.mu.Unlock()
			if v.busy {
				v.cpu += time.Second
			}
			return v.cpu, nil
		},
		Asleep:    v.asleep.Load,
		Hibernate: func(context.Context) error { v.hibernates.Add(1); v.asleep.Store(true); return nil },
		Wake:      func(context.Context) error { v.wakes.Add(1); v.asleep.Store(false); return nil },
		Log:       hclog.NewNullLogger(),
		Every:     20 * time.Millisecond,
		Tick:      5 * time.Millisecond,
	}
}

func run(t *testing.T, w *Watch) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// An idle VM hibernates after its idle time, and a new connection to its
// port wakes it; one that was there before does not.
func TestIdleHibernatesAndAConnectionWakes(t *testing.T) {
	port := listen(t)
	old := dial(t, port)
	_ = old
	v := &vm{after: 60 * time.Millisecond, sessions: []session.Info{{Name: "claude", State: agentstate.Waiting}, {Name: "old", Exited: true}}}
	w := v.watch(port)
	w.Held = func() (int, []string) { return 0, []string{old.LocalAddr().String()} } // the connection there is the holder's
	run(t, w)
	waitFor(t, "the hibernation", func() bool { return v.hibernates.Load() == 1 })
	time.Sleep(100 * time.Millisecond)
	if v.wakes.Load() != 0 {
		t.Fatal("woken with no new connection")
	}
	dial(t, port)
	waitFor(t, "the wake", func() bool { return v.wakes.Load() == 1 })
}

// Why a VM stays awake is in the holder's log, once for each new reason
// (not a line every look).
func TestWhyItStaysAwakeIsLoggedOnce(t *testing.T) {
	v := &vm{after: 20 * time.Millisecond, busy: true}
	w := v.watch()
	var buf testutil.SyncBuffer
	w.Log = hclog.New(&hclog.LoggerOptions{Output: &buf, Level: hclog.Info})
	run(t, w)
	waitFor(t, "a few looks", func() bool { return strings.Count(buf.String(), "\n") > 0 })
	time.Sleep(200 * time.Millisecond) // ten looks more
	if got := buf.String(); strings.Count(got, "kept awake") != 1 || !strings.Contains(got, "why=\"its CPU is busy\"") {
		t.Errorf("the log of a busy VM's looks:\n%s\nwant one line saying its CPU is busy", got)
	}
}

// The holder's own connection does not wake the VM: the look at the
// sessions that decides on the hibernation is a request on it, sent after
// the connections were last noted, and a keepalive or a relayed command
// may follow while it sleeps. Counted, the VM woke at once after every
// hibernation (seen on real boots: hibernated, woken by the SSH port).
func TestTheHoldersOwnRequestsDoNotWake(t *testing.T) {
	port := listen(t)
	own := dial(t, port)
	v := &vm{after: 60 * time.Millisecond, sessions: []session.Info{{Name: "claude", State: agentstate.Waiting}}}
	w := v.watch(port)
	w.Held = func() (int, []string) { return 0, []string{own.LocalAddr().String()} }
	list := w.Sessions
	w.Sessions = func(ctx context.Context) ([]session.Info, error) {
		if _, err := own.Write([]byte("a look at the sessions")); err != nil {
			return nil, err
		}
		return list(ctx)
	}
	run(t, w)
	waitFor(t, "the hibernation", func() bool { return v.hibernates.Load() == 1 })
	if _, err := own.Write([]byte("a keepalive while it sleeps")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if n := v.wakes.Load(); n != 0 {
		t.Fatalf("woken %d times by the holder's own connection", n)
	}
	dial(t, port)
	waitFor(t, "the wake", func() bool { return v.wakes.Load() == 1 })
}

// What keeps a VM from hibernating: a session at work or attached, a
// client sending on its ports, a download from them, a command through
// the holder, a busy CPU, idle_suspend off.
func TestInUseNeverHibernates(t *testing.T) {
	for name, set := range map[string]func(v *vm, t *testing.T) (port int){
		"working": func(v *vm, t *testing.T) int {
			v.sessions = []session.Info{{Name: "a", State: agentstate.Working}}
			return listen(t)
		},
		"attached": func(v *vm, t *testing.T) int {
			v.sessions = []session.Info{{Name: "a", State: agentstate.Done, Attached: 1}}
			return listen(t)
		},
		"client": func(_ *vm, t *testing.T) int {
			port := listen(t)
			chatty(t, dial(t, port), []byte("x"))
			return port
		},
		"download": func(_ *vm, t *testing.T) int {
			port := sending(t, make([]byte, 32<<10))
			drain(t, dial(t, port))
			return port
		},
		"channel":  func(v *vm, t *testing.T) int { v.channels = 1; return listen(t) },
		"busy CPU": func(v *vm, t *testing.T) int { v.busy = true; return listen(t) },
		"off":      func(v *vm, t *testing.T) int { v.after = 0; return listen(t) },
	} {
		t.Run(name, func(t *testing.T) {
			v := &vm{after: 40 * time.Millisecond}
			run(t, v.watch(set(v, t)))
			time.Sleep(300 * time.Millisecond)
			if n := v.hibernates.Load(); n != 0 {
				t.Errorf("hibernated %d times", n)
			}
			if name == "off" && v.listed.Load() != 0 {
				t.Error("with idle_suspend off, the sessions were read")
			}
		})
	}
}

// Connections open and quiet do not keep a VM awake: a client's kept one,
// one on which the VM's side sends keep-alives (agent-mcp's SSE comments),
// and the holder's own however busy.
func TestQuietConnectionsLetItHibernate(t *testing.T) {
	port := listen(t)
	dial(t, port)
	holders := dial(t, port)
	chatty(t, holders, []byte("x"))
	keepalive := sending(t, []byte(": \n\n"))
	drain(t, dial(t, keepalive))
	v := &vm{after: 60 * time.Millisecond}
	w := v.watch(port, keepalive)
	w.Held = func() (int, []string) { return 0, []string{holders.LocalAddr().String()} }
	run(t, w)
	waitFor(t, "the hibernation", func() bool { return v.hibernates.Load() == 1 })
}

// chatty writes b on c every 5 ms until the test ends.
func chatty(t *testing.T, c net.Conn, b []byte) {
	t.Helper()
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() { defer close(stopped); writeEvery(c, b, done) }()
	t.Cleanup(func() { close(done); <-stopped })
}

// writeEvery writes b on c every 5 ms until done or a write fails.
func writeEvery(c net.Conn, b []byte, done <-chan struct{}) {
	for {
		select {
		case <-done:
			return
		case <-time.After(5 * time.Millisecond):
			if _, err := c.Write(b); err != nil {
				return
			}
		}
	}
}

// sending serves on 127.0.0.1, writing b every 5 ms on each connection it
// takes, and returns its port.
func sending(t *testing.T, b []byte) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	done := make(chan struct{})
	t.Cleanup(func() { close(done); l.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				writeEvery(c, b, done)
			}()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}

// drain reads c until it ends.
func drain(t *testing.T, c net.Conn) {
	t.Helper()
	go func() { _, _ = io.Copy(io.Discard, c) }()
}

// A request on a connection that was open before the hibernation (an HTTP
// client's kept-alive one) wakes the VM too; the connection open and quiet
// does not.
func TestARequestOnAKeptConnectionWakes(t *testing.T) {
	port := listen(t)
	kept := dial(t, port)
	v := &vm{after: 40 * time.Millisecond}
	w := v.watch(port)
	run(t, w)
	waitFor(t, "the hibernation", func() bool { return v.hibernates.Load() == 1 })
	time.Sleep(100 * time.Millisecond)
	if v.wakes.Load() != 0 {
		t.Fatal("woken by a quiet connection")
	}
	if _, err := kept.Write([]byte("GET / HTTP/1.1\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the wake", func() bool { return v.wakes.Load() == 1 })
}

// A wake that fails is tried again only for another new connection.
func TestAFailedWake(t *testing.T) {
	port := listen(t)
	v := &vm{}
	v.asleep.Store(true)
	w := v.watch(port)
	var tries atomic.Int32
	w.Wake = func(context.Context) error { tries.Add(1); return errors.New("no") }
	run(t, w)
	time.Sleep(30 * time.Millisecond)
	dial(t, port)
	waitFor(t, "a first try", func() bool { return tries.Load() == 1 })
	time.Sleep(100 * time.Millisecond)
	if n := tries.Load(); n != 1 {
		t.Fatalf("tried %d times for one connection", n)
	}
	dial(t, port)
	waitFor(t, "a second try", func() bool { return tries.Load() == 2 })
}
