package browser

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/agent-vm/agent-vm/internal/bridge"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/hostdir"
	"github.com/agent-vm/agent-vm/internal/state"
)

// TestHostStopSparesAChromiumAnotherVMUses: a VM other than the one
// closing its bridge still has one to agent-vm's Chromium, so Stop names
// it and stops nothing; without it, Stop finds none running here.
func TestHostStopSparesAChromiumAnotherVMUses(t *testing.T) {
	dir := t.TempDir()
	entry := func(slug string, launched bool) state.Entry {
		l := state.Layout{Dir: filepath.Join(dir, slug)}
		if err := os.Mkdir(l.Dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := l.MakeDirs(); err != nil {
			t.Fatal(err)
		}
		if err := bridge.WriteConfig(l.RunDir(), bridge.Config{DevTools: "127.0.0.1:9222", Launched: launched}); err != nil {
			t.Fatal(err)
		}
		return state.Entry{Slug: slug, Layout: l, Record: &state.Record{Slug: slug}}
	}
	entries := []state.Entry{entry("closing", true), entry("other", true), entry("plain", false)}
	h := Host{Run: execx.OS{}, Dir: &hostdir.Dir{Path: filepath.Join(dir, "browser"), Mode: 0o700},
		Entries: func() ([]state.Entry, error) { return entries, nil }}
	usedBy, stopped, err := h.Stop(context.Background(), "closing")
	if err != nil || usedBy != "other" || stopped {
		t.Errorf("Stop(except closing) = %q, %v, %v; want it used by other, nothing stopped", usedBy, stopped, err)
	}
	entries = entries[:1]
	usedBy, stopped, err = h.Stop(context.Background(), "closing")
	if err != nil || usedBy != "" || stopped {
		t.Errorf("Stop with no other user = %q, %v, %v; want nothing running to stop", usedBy, stopped, err)
	}
}
