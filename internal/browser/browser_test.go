package browser

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/agent-vm/agent-vm/internal/bridge"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/testutil"
)

// fakeVMs is a FAKE of vm's Manager for the browser room: one VM in a directory
// of the test's, in the state the test says; it records each ReloadBridges call
// (what the holder would be asked to open) and answers it with reloadErr. Connect
// is never reached in these tests (no DevTools relay opens), and says so if it
// is.
type fakeVMs struct {
	e         state.Entry
	state     string
	reloadErr error
	reloads   []bridge.Config
}

func newFakeVMs(t *testing.T, r *state.Record) *fakeVMs {
	t.Helper()
	dir := t.TempDir()
	r.Version, r.Branch, r.Slug = state.RecordVersion, "feat", "feat"
	e := state.Entry{Slug: "feat", Layout: state.Layout{Dir: dir}, Record: r}
	if err := state.WriteRecord(e.Layout.Record(), r); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(e.Layout.RunDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	return &fakeVMs{e: e, state: driver.StateRunning}
}

func (f *fakeVMs) Recorded(ctx context.Context, name string) (state.Entry, error) {
	if name != "feat" {
		return state.Entry{}, state.NotFound("no VM " + name)
	}
	return f.e, nil
}

func (f *fakeVMs) Locked(ctx context.Context, name string) (state.Entry, *state.Lock, error) {
	e, err := f.Recorded(ctx, name)
	if err != nil {
		return e, nil, err
	}
	l, err := state.AcquireLock(ctx, filepath.Join(f.e.Layout.Dir, "lock"))
	return e, l, err
}

func (f *fakeVMs) State(context.Context, state.Entry) string { return f.state }

func (f *fakeVMs) Connect(context.Context, string) (*ssh.Client, string, error) {
	return nil, "", errors.New("fake: Connect is not part of this test")
}

// PullLog: the VM is on this machine, its log here.
func (f *fakeVMs) PullLog(context.Context, state.Entry, bool) (func(), error) {
	return func() {}, nil
}

func (f *fakeVMs) ReloadBridges(_ context.Context, e state.Entry) error {
	d, err := bridge.ReadConfig(e.Layout.RunDir())
	if err != nil {
		return err
	}
	f.reloads = append(f.reloads, d)
	return f.reloadErr
}

func (f *fakeVMs) bridges(t *testing.T) bridge.Config {
	t.Helper()
	d, err := bridge.ReadConfig(f.e.Layout.RunDir())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// bridgeDir is a directory of the test's, 0700, as Claude in Chrome's
// native host makes it; with sock, a socket listens in it.
func bridgeDir(t *testing.T, sock bool) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "bridge")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if sock {
		l, err := net.Listen("unix", filepath.Join(dir, "1234.sock"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
	}
	return dir
}

func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

func TestOpenRefusals(t *testing.T) {
	ctx := context.Background()
	empty := bridgeDir(t, false)
	for _, tc := range []struct {
		name  string
		setup func(*fakeVMs)
		o     Options
		want  string
	}{
		{"no bridge", nil, Options{}, "no bridge named"},
		{"stopped", func(f *fakeVMs) { f.state = driver.StateStopped }, Options{OpenURLs: true}, `VM "feat" is stopped`},
		{"offline", func(f *fakeVMs) { f.e.Record.Net = &state.Net{Mode: egress.ModeOffline} }, Options{OpenURLs: true}, "--force opens it anyway"},
		{"no bridge socket", nil, Options{ChromeBridge: true, Getenv: env(map[string]string{bridge.ChromeBridgeDirEnv: empty})}, "run `claude --chrome` on the host"},
		{"no DevTools endpoint", nil, Options{CDP: true, Port: testutil.FreePort(t)}, "nothing answers"},
		{"port out of range", nil, Options{CDP: true, Port: 70000}, "--port"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeVMs(t, &state.Record{})
			if tc.setup != nil {
				tc.setup(f)
			}
			tc.o.Name = "feat"
			_, err := Open(ctx, f, tc.o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Open = %v, want an error containing %q", err, tc.want)
			}
			if d := f.bridges(t); d.Any() || len(f.reloads) != 0 {
				t.Errorf("a refused Open left bridges %+v and asked the holder %d times", d, len(f.reloads))
			}
		})
	}
}

// A VM whose network is offline gets a bridge with Force, marked so.
func TestOpenForcedOnAnOfflineVM(t *testing.T) {
	f := newFakeVMs(t, &state.Record{Net: &state.Net{Mode: egress.ModeOffline}})
	info, err := Open(context.Background(), f, Options{Name: "feat", OpenURLs: true, Force: true})
	if err != nil {
		t.Fatal(err)
	}
	if !info.Bridges.OpenURLs || !info.Bridges.Forced || len(f.reloads) != 1 {
		t.Fatalf("forced open: %+v, %d reloads", info.Bridges, len(f.reloads))
	}
	if !strings.Contains(strings.Join(info.Open, "\n"), "offline VM (--force)") {
		t.Errorf("the forced bridge is not shown as such: %q", info.Open)
	}
}

// The bridge bridge records the socket directory it found a socket in; a
// second bridge adds to it; Off closes both; Show follows.
func TestOpenAddsBridgesAndOffClosesThem(t *testing.T) {
	ctx := context.Background()
	f := newFakeVMs(t, &state.Record{})
	dir := bridgeDir(t, true)
	if _, err := Open(ctx, f, Options{Name: "feat", ChromeBridge: true, Getenv: env(map[string]string{bridge.ChromeBridgeDirEnv: dir})}); err != nil {
		t.Fatal(err)
	}
	info, err := Open(ctx, f, Options{Name: "feat", OpenURLs: true})
	if err != nil {
		t.Fatal(err)
	}
	if info.Bridges.ChromeBridge != dir || !info.Bridges.OpenURLs || !strings.HasPrefix(info.Bridges.Log, f.e.Layout.Dir) {
		t.Fatalf("bridges after two opens: %+v", info.Bridges)
	}
	if shown, _ := Show(ctx, f, "feat"); len(shown.Open) != 2 {
		t.Errorf("Show: %q, want two bridges", shown.Open)
	}
	if _, err := Off(ctx, f, "feat", nil, nil); err != nil {
		t.Fatal(err)
	}
	if d := f.bridges(t); d.Any() {
		t.Errorf("after Off: %+v", d)
	}
	if last := f.reloads[len(f.reloads)-1]; last.Any() {
		t.Errorf("the holder's last reload still had bridges: %+v", last)
	}
}

// When the holder cannot open the bridges, the bridges that were are put back
// and the holder asked again.
func TestOpenPutsTheBridgesBackWhenTheHolderFails(t *testing.T) {
	ctx := context.Background()
	f := newFakeVMs(t, &state.Record{})
	before := bridge.Config{OpenURLs: true}
	if err := bridge.WriteConfig(f.e.Layout.RunDir(), before); err != nil {
		t.Fatal(err)
	}
	f.reloadErr = errors.New("fake: the holder refused")
	dir := bridgeDir(t, true)
	_, err := Open(ctx, f, Options{Name: "feat", ChromeBridge: true, Getenv: env(map[string]string{bridge.ChromeBridgeDirEnv: dir})})
	if err == nil || !strings.Contains(err.Error(), "the holder refused") {
		t.Fatalf("Open = %v, want the holder's error", err)
	}
	if d := f.bridges(t); d != before {
		t.Errorf("bridges after a failed open: %+v, want %+v back", d, before)
	}
	if len(f.reloads) != 2 || f.reloads[0].ChromeBridge != dir || f.reloads[1] != before {
		t.Errorf("holder reloads: %+v, want the new bridges then the old", f.reloads)
	}
}

// run --chrome with no bridge socket and no DevTools endpoint: the
// guidance, what it fell back to (nothing), and no bridge.
func TestForAgentWithNothingOnTheHost(t *testing.T) {
	f := newFakeVMs(t, &state.Record{})
	var said []string
	if probe, err := bridge.ProbeDevTools(context.Background(), bridge.DevToolsAddr(DefaultDevToolsPort)); err == nil {
		testutil.SkipOrFail(t, "a DevTools endpoint answers on this host (%s): the fallback would take it", probe.Browser)
	}
	bridgeOn, err := ForAgent(context.Background(), f, "feat", env(map[string]string{bridge.ChromeBridgeDirEnv: bridgeDir(t, false)}),
		func(s string) { said = append(said, s) })
	if err != nil || bridgeOn {
		t.Fatalf("ForAgent = %v, %v; want no bridge, no error", bridgeOn, err)
	}
	all := strings.Join(said, "\n")
	for _, want := range []string{"run `claude --chrome` on the host", "no DevTools endpoint to fall back to", "--launch"} {
		if !strings.Contains(all, want) {
			t.Errorf("run --chrome said %q, lacking %q", all, want)
		}
	}
	if f.bridges(t).Any() {
		t.Error("a bridge opened")
	}
}

// With a bridge socket, run --chrome tunnels it and the agent gets
// --chrome.
func TestForAgentTunnelsTheBridge(t *testing.T) {
	f := newFakeVMs(t, &state.Record{})
	dir := bridgeDir(t, true)
	bridgeOn, err := ForAgent(context.Background(), f, "feat", env(map[string]string{bridge.ChromeBridgeDirEnv: dir}), func(string) {})
	if err != nil || !bridgeOn {
		t.Fatalf("ForAgent = %v, %v; want the bridge", bridgeOn, err)
	}
	if d := f.bridges(t); d.ChromeBridge != dir {
		t.Errorf("bridges: %+v", d)
	}
}
