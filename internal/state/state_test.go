package state

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/hostdir"
)

func sampleRecord(branch string) *Record {
	slug, _ := Slug(branch)
	return &Record{Version: RecordVersion, ID: NewID(), Branch: branch, Slug: slug, MachineName: "agent-vm-" + slug,
		Backend: "qemu", CreatedAt: time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC),
		Ports: Ports{SSH: 2222, MCP: 8000}, Resources: Resources{CPUs: 2, MemoryMiB: 4096, DiskGiB: 20},
		Guest: Guest{User: "dev", UID: 1000, GID: 1000}}
}

func TestRecordRoundTripAndVersions(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, RecordFile)
	r := sampleRecord("feature/x")
	if err := WriteRecord(p, r); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(p)
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("record mode %v, want 0600", fi.Mode().Perm())
	}
	got, err := ReadRecord(p)
	if err != nil {
		t.Fatal(err)
	}
	if got.Branch != r.Branch || got.Ports != r.Ports || !got.CreatedAt.Equal(r.CreatedAt) || got.ID != r.ID {
		t.Errorf("round trip: got %+v", got)
	}

	// Unknown fields (a newer minor version) are tolerated.
	var m map[string]any
	b, _ := os.ReadFile(p)
	json.Unmarshal(b, &m)
	m["future_field"] = map[string]any{"x": 1}
	b, _ = json.Marshal(m)
	if _, err := ParseRecord(p, b); err != nil {
		t.Errorf("unknown field refused: %v", err)
	}
	// A newer major version is refused with a message that says so.
	m["version"] = RecordVersion + 1
	b, _ = json.Marshal(m)
	if _, err := ParseRecord(p, b); err == nil || !strings.Contains(err.Error(), "newer agent-vm") {
		t.Errorf("newer version: got %v", err)
	}
	for _, bad := range []string{`{`, `{}`, `{"version": 1}`, `{"version":1,"branch":"x","slug":"../x","ports":{"ssh":1,"mcp":2}}`} {
		if _, err := ParseRecord(p, []byte(bad)); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

func TestListShowsCorruptRecordsWithoutFailing(t *testing.T) {
	root, err := Open(top(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"good", "corrupt", "future", "empty"} {
		os.MkdirAll(root.Layout(b).Dir, 0o700)
	}
	good := sampleRecord("good")
	WriteRecord(root.Layout("good").Record(), good)
	os.WriteFile(root.Layout("corrupt").Record(), []byte("{not json"), 0o600)
	os.WriteFile(root.Layout("future").Record(), []byte(`{"version": 99}`), 0o600)
	os.MkdirAll(filepath.Join(root.Dir, "Not_A_Slug"), 0o700)
	os.WriteFile(filepath.Join(root.Dir, "stray-file"), nil, 0o600)

	entries, err := root.List()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, e := range entries {
		if e.Err != nil {
			got[e.Slug] = e.Err.Error()
		} else {
			got[e.Slug] = "ok"
		}
	}
	want := map[string]string{"good": "ok", "corrupt": "not valid JSON", "future": "newer agent-vm",
		"empty": "has no config.json", "Not_A_Slug": "not an agent-vm VM directory"}
	for slug, frag := range want {
		if !strings.Contains(got[slug], frag) {
			t.Errorf("%s: got %q, want it to contain %q", slug, got[slug], frag)
		}
	}
	if len(got) != len(want) {
		t.Errorf("entries: %v", got)
	}
}

func TestStagingCommitAbortAndSweep(t *testing.T) {
	root, _ := Open(top(t.TempDir()))
	s, err := root.BeginCreate("feature-x")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(s.Layout.Dir, "f"), []byte("x"), 0o600)
	if entries, _ := root.List(); len(entries) != 0 {
		t.Errorf("a staging dir is visible in List: %+v", entries)
	}
	l, err := s.Commit()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(l.Dir, "f")); err != nil {
		t.Errorf("committed dir lacks its file: %v", err)
	}
	s2, _ := root.BeginCreate("feature-x")
	if _, err := s2.Commit(); err == nil {
		t.Error("commit over an existing VM dir succeeded")
	}
	s2.Abort()
	s3, _ := root.BeginCreate("other")
	s3.Abort()
	if des, _ := os.ReadDir(filepath.Join(root.Dir, tmpDir)); len(des) != 0 {
		t.Errorf(".tmp not empty after aborts: %v", des)
	}

	// A staging dir whose owner died (its lock file unlocked) is swept by the
	// next Open; one whose owner lives is kept.
	dead := filepath.Join(root.Dir, tmpDir, "dead.abc")
	os.MkdirAll(filepath.Join(dead, "workspace"), 0o700)
	os.WriteFile(dead+".lock", nil, 0o600)
	live, _ := root.BeginCreate("live")
	if _, err := Open(top(root.Dir)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Errorf("dead staging dir not swept: %v", err)
	}
	if _, err := os.Stat(live.Layout.Dir); err != nil {
		t.Errorf("live staging dir swept: %v", err)
	}
	live.Abort()
}

func TestRemoveOnlyTouchesTheVMDir(t *testing.T) {
	root, _ := Open(top(t.TempDir()))
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "keep"), []byte("x"), 0o600)
	l := root.Layout("vm")
	os.MkdirAll(filepath.Join(l.Dir, "workspace", "ro"), 0o700)
	os.WriteFile(filepath.Join(l.Dir, "workspace", "ro", "f"), []byte("x"), 0o400)
	os.Chmod(filepath.Join(l.Dir, "workspace", "ro"), 0o500)
	os.Symlink(outside, filepath.Join(l.Dir, "workspace", "link"))
	if err := root.Remove("vm"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(l.Dir); !os.IsNotExist(err) {
		t.Errorf("VM dir still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join(outside, "keep")); err != nil {
		t.Errorf("a file outside the VM dir went away: %v", err)
	}
	if err := root.Remove("../x"); err == nil {
		t.Error("Remove accepted a path")
	}
	if des, _ := os.ReadDir(filepath.Join(root.Dir, trashDir)); len(des) != 0 {
		t.Errorf(".trash not empty: %v", des)
	}
}

func TestLockExcludesAndHonoursContext(t *testing.T) {
	root, _ := Open(top(t.TempDir()))
	l, err := root.LockVM(context.Background(), "x")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := root.LockVM(ctx, "x"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("second lock: got %v, want deadline exceeded", err)
	}
	l.Release()
	l2, err := root.LockVM(context.Background(), "x")
	if err != nil {
		t.Errorf("lock after release: %v", err)
	}
	l2.Release()
}

// Creates and removals racing with the sweeps of other commands never lose
// their entry: a sweep must not mistake a lock file its owner has created
// but not yet locked for a dead one. (flock conflicts between open files of
// one process as between processes, so goroutines stand in for commands.)
func TestSweepsNeverTakeALiveCreate(t *testing.T) {
	dir := t.TempDir()
	root, err := Open(top(dir))
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var sweeps sync.WaitGroup
	for i := 0; i < 2; i++ {
		sweeps.Add(1)
		go func() {
			defer sweeps.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := Open(top(dir)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	var creates sync.WaitGroup
	for i := 0; i < 4; i++ {
		creates.Add(1)
		go func(i int) {
			defer creates.Done()
			slug := fmt.Sprintf("vm-%d", i)
			for j := 0; j < 300; j++ {
				s, err := root.BeginCreate(slug)
				if err != nil {
					t.Errorf("create %d of %s: %v", j, slug, err)
					return
				}
				if err := os.WriteFile(filepath.Join(s.Layout.Dir, "f"), nil, 0o600); err != nil {
					t.Errorf("create %d of %s: its staging dir went away: %v", j, slug, err)
				}
				if _, err := s.Commit(); err != nil {
					t.Errorf("commit %d of %s: %v", j, slug, err)
					return
				}
				if err := root.Remove(slug); err != nil {
					t.Errorf("remove %d of %s: %v", j, slug, err)
					return
				}
			}
		}(i)
	}
	creates.Wait()
	close(stop)
	sweeps.Wait()
}

// A branch may be called "ports": its VM lock is not the port allocator's.
func TestVMLockIsNeverAnInternalLock(t *testing.T) {
	root, _ := Open(top(t.TempDir()))
	for _, slug := range []string{"ports", "sweep"} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		vm, err := root.LockVM(ctx, slug)
		if err != nil {
			t.Fatal(err)
		}
		ports, err := root.LockPorts(ctx)
		if err != nil {
			t.Errorf("VM %q: the ports lock waits on the VM's lock: %v", slug, err)
		} else {
			ports.Release()
		}
		if _, err := root.BeginCreate(slug); err != nil {
			t.Errorf("VM %q: staging waits on the VM's lock: %v", slug, err)
		}
		vm.Release()
		cancel()
	}
}

// Records written by agent-vm before version 2 (these two by main at
// 45dfa23: a qemu VM started once with --reprovision, a nixos VM with
// --config and --nixpkgs) load with their backend fields in the section.
func TestVersion1RecordsMigrate(t *testing.T) {
	for file, want := range map[string]map[string]any{
		"testdata/record-v1-qemu.json":  {"image": "", "provision": 1.0},
		"testdata/record-v1-nixos.json": {"config": "/tmp/rec/vm.nix", "nixpkgs": "/tmp/rec/nixpkgs"},
	} {
		r, err := ReadRecord(file)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if r.Version != RecordVersion {
			t.Errorf("%s: version %d after migration, want %d", file, r.Version, RecordVersion)
		}
		var got map[string]any
		if err := r.Section(&got); err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: section %v, want %v", file, got, want)
		}
		if r.Git.Source != "/tmp/rec/src" || r.Ports.SSH == 0 || r.Resources.MemoryMiB == 0 {
			t.Errorf("%s: common fields lost: %+v", file, r)
		}
		// Written again, it is a version 2 record that reads back the same.
		p := filepath.Join(t.TempDir(), RecordFile)
		if err := WriteRecord(p, r); err != nil {
			t.Fatal(err)
		}
		raw, _ := os.ReadFile(p)
		if strings.Contains(string(raw), `"provision"`) && !strings.Contains(string(raw), `"settings"`) {
			t.Errorf("%s: rewritten record keeps the old top-level fields:\n%s", file, raw)
		}
		again, err := ReadRecord(p)
		if err != nil || string(again.Settings) != string(r.Settings) {
			t.Errorf("%s: rewritten record reads back %v (%v), want section %s", file, again, err, r.Settings)
		}
	}
}

func TestRecordForwards(t *testing.T) {
	p := filepath.Join(t.TempDir(), RecordFile)
	r := sampleRecord("web")
	r.Forwards = []Forward{{Guest: 3000, Host: 3000}, {Guest: 80, Host: 8001}}
	if err := WriteRecord(p, r); err != nil {
		t.Fatal(err)
	}
	got, err := ReadRecord(p)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got.Forwards) != fmt.Sprint(r.Forwards) {
		t.Errorf("forwards after a round trip: got %v, want %v", got.Forwards, r.Forwards)
	}
	for _, tc := range []struct {
		fwds []Forward
		want string
	}{
		{[]Forward{{Guest: 0, Host: 3000}}, "invalid forward"},
		{[]Forward{{Guest: 3000, Host: 70000}}, "invalid forward"},
		{[]Forward{{Guest: 3000, Host: 3000}, {Guest: 3000, Host: 3001}}, "guest port 3000 twice"},
		{[]Forward{{Guest: 3000, Host: 3000}, {Guest: 3001, Host: 3000}}, "host port 3000 twice"},
		{[]Forward{{Guest: 3000, Host: 2222}}, "host port 2222 twice"}, // the SSH port's
	} {
		r.Forwards = tc.fwds
		b, _ := r.Marshal()
		if _, err := ParseRecord(p, b); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("forwards %v: got %v, want an error with %q", tc.fwds, err, tc.want)
		}
	}
}

// top is a state directory of its own at dir.
func top(dir string) *hostdir.Dir { return hostdir.Top(dir, 0o700, hostdir.InXDG) }
