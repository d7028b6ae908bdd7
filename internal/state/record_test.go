package state

import (
	"encoding/json"
	"os"
	"reflect"
	"testing"
	"time"
)

// TestForkAs holds every field of the record to a decision: a fork's own
// (identity, host ports, paths, the backend's section) or its source's. A
// field added to Record fails here until it is given one.
func TestForkAs(t *testing.T) {
	r := &Record{
		Version: RecordVersion, ID: NewID(), Branch: "feature/a", Slug: "feature-a", MachineName: MachineName("feature-a"),
		Backend: "qemu", Host: "elsewhere", CreatedAt: time.Unix(1, 0).UTC(),
		Ports:     Ports{SSH: 2222, MCP: 8000},
		Resources: Resources{CPUs: 2, MemoryMiB: 2048, DiskGiB: 20},
		Guest:     Guest{User: "agent", UID: 1000, GID: 1000, Proxy: true},
		Git:       Git{Source: "/src/repo", Repo: "repo-id", OriginURL: "https://git.example/repo.git"},
		Paths:     Paths{Dir: "/state/feature-a"}, AllowOrigins: []string{"https://claude.ai"},
		Agent: "claude", Agents: []string{"claude@1"}, Forwards: []Forward{{Guest: 3000, Host: 3000}},
		Packages: []string{"jq"}, RepoPackages: []string{"ripgrep"}, IdleSuspend: "30m", NoHostCA: true,
		AutoCheckpoint: &AutoCheckpoint{Every: "10m0s", Keep: 5},
		Exposed:        []Exposed{{Port: 9000, Why: "x", By: ExposedByMCPSync}},
		Net:            &Net{Mode: "allow", Allow: []string{"example.com"}},
		MCPSynced:      []string{"fs"}, WorkspaceCache: "auto",
		Placeholders: map[string]string{"TOKEN": "agent-vm-placeholder-1"}, SecretHosts: []string{"api.example.com"},
		Settings: json.RawMessage(`{"provision":1}`),
	}
	now := time.Unix(1000, 500).UTC()
	f, err := r.ForkAs("try/b", "try-b", now)
	if err != nil {
		t.Fatal(err)
	}
	own := map[string]any{
		"Branch": "try/b", "Slug": "try-b", "MachineName": "agent-vm-try-b", "CreatedAt": time.Unix(1000, 0).UTC(),
		"Ports": Ports{}, "Forwards": []Forward(nil), "Paths": Paths{}, "Settings": json.RawMessage(nil),
	}
	rv, fv := reflect.ValueOf(*r), reflect.ValueOf(*f)
	for i := range rv.NumField() {
		name := rv.Type().Field(i).Name
		got := fv.Field(i).Interface()
		switch want, ok := own[name]; {
		case name == "ID":
			if f.ID == "" || f.ID == r.ID {
				t.Errorf("ID: %q, want a new one (the source's is %q)", f.ID, r.ID)
			}
		case ok:
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%s: %#v, want the fork's own %#v", name, got, want)
			}
		default:
			if !reflect.DeepEqual(got, rv.Field(i).Interface()) {
				t.Errorf("%s: %#v, want the source's %#v", name, got, rv.Field(i).Interface())
			}
			if rv.Field(i).IsZero() {
				t.Errorf("%s is zero in the test's source record: set it, so that this test sees it copied", name)
			}
		}
	}
	// A copy: changing the fork's policy leaves the source's alone.
	f.Net.Allow[0], f.Placeholders["TOKEN"] = "changed", "changed"
	if r.Net.Allow[0] != "example.com" || r.Placeholders["TOKEN"] != "agent-vm-placeholder-1" {
		t.Errorf("the fork shares memory with its source: %v %v", r.Net.Allow, r.Placeholders)
	}
}

// Follow reads the record again when its file changed (a forward added
// while the VM runs), and keeps the last one read while the file cannot be
// read.
func TestFollow(t *testing.T) {
	l := Layout{Dir: t.TempDir()}
	r := &Record{Version: RecordVersion, ID: NewID(), Branch: "feat", Slug: "feat", Ports: Ports{SSH: 2222, MCP: 8000}}
	if err := WriteRecord(l.Record(), r); err != nil {
		t.Fatal(err)
	}
	follow := Follow(l, r)
	if got := follow(); len(got.Forwards) != 0 || got.Ports.SSH != 2222 {
		t.Fatalf("first: %+v", got)
	}
	r2 := *r
	r2.Forwards = []Forward{{Guest: 3000, Host: 3001}}
	if err := WriteRecord(l.Record(), &r2); err != nil {
		t.Fatal(err)
	}
	if got := follow(); len(got.Forwards) != 1 {
		t.Errorf("after the file changed: %+v", got.Forwards)
	}
	// Rewritten at once with the same size and modification time (within
	// the kernel's timestamp tick, as the time is set here): still read.
	fi, err := os.Stat(l.Record())
	if err != nil {
		t.Fatal(err)
	}
	r2.Forwards = []Forward{{Guest: 3000, Host: 3002}}
	if err := WriteRecord(l.Record(), &r2); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(l.Record(), fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	if fi2, _ := os.Stat(l.Record()); fi2.Size() != fi.Size() {
		t.Fatalf("the rewrite changed the size (%d -> %d): not the case under test", fi.Size(), fi2.Size())
	}
	if got := follow(); len(got.Forwards) != 1 || got.Forwards[0].Host != 3002 {
		t.Errorf("after a rewrite of the same size and time: %+v", got.Forwards)
	}
	if err := os.WriteFile(l.Record(), []byte("{torn"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := follow(); len(got.Forwards) != 1 {
		t.Errorf("with a torn file: %+v, want the record last read", got.Forwards)
	}
}
