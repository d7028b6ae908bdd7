package cloudinit

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/iso9660"
	"github.com/agent-vm/agent-vm/internal/testutil"
)

func TestWriteSeedReadsBackWithRealTools(t *testing.T) {
	xorriso := testutil.Program(t, "xorriso")
	blkid := testutil.Program(t, "blkid")
	bin := agentBinary(t)
	c := goldenCases(t)["custom-ids-with-origins"]
	path := filepath.Join(t.TempDir(), "seed.iso")
	extra := iso9660.File{Name: "vendor-data", Data: []byte("#cloud-config\n{}\n"), Mode: 0o644}
	if err := WriteSeed(context.Background(), path, c, SeedOptions{AgentBinary: bin, ModTime: seedTime, Extra: []iso9660.File{extra}}); err != nil {
		t.Fatalf("WriteSeed: %v", err)
	}

	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("seed mode %v, want 0600: it holds the host private key", st.Mode().Perm())
	}
	label, _ := runTool(t, blkid, "-o", "value", "-s", "LABEL", path)
	if strings.TrimSpace(label) != SeedLabel {
		t.Errorf("blkid LABEL %q, want %q", label, SeedLabel)
	}

	listing, _ := runTool(t, xorriso, "-indev", path, "-find", "/", "-type", "f", "-exec", "lsdl")
	wantModes := map[string]string{
		"user-data": "-rw-------", "meta-data": "-rw-r--r--", "network-config": "-rw-r--r--",
		"agent-vm": "-rwxr-xr-x", "agent-vm.sha256": "-rw-r--r--", "vendor-data": "-rw-r--r--",
	}
	lines := strings.Split(strings.TrimSpace(listing), "\n")
	if len(lines) != len(wantModes) {
		t.Errorf("the seed holds %d files, want %d:\n%s", len(lines), len(wantModes), listing)
	}
	for name, mode := range wantModes {
		found := false
		for _, l := range lines {
			if strings.HasSuffix(l, "'/"+name+"'") {
				found = true
				if !strings.HasPrefix(l, mode+" ") {
					t.Errorf("%s: got %q, want mode %s", name, l, mode)
				}
			}
		}
		if !found {
			t.Errorf("the seed lacks %s:\n%s", name, listing)
		}
	}

	seed, err := Render(c)
	if err != nil {
		t.Fatal(err)
	}
	binBytes, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	digest := sha256.Sum256(binBytes)
	for name, want := range map[string][]byte{
		"user-data": seed.UserData, "meta-data": seed.MetaData, "network-config": seed.NetworkConfig,
		"agent-vm": binBytes, "agent-vm.sha256": []byte(hex.EncodeToString(digest[:]) + "\n"), "vendor-data": extra.Data,
	} {
		dst := filepath.Join(t.TempDir(), name)
		runTool(t, xorriso, "-osirrox", "on", "-indev", path, "-extract", "/"+name, dst)
		got, err := os.ReadFile(dst)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s on the seed differs from what was written (%d vs %d bytes)", name, len(got), len(want))
		}
	}
}

func TestWriteSeedIsDeterministic(t *testing.T) {
	bin := agentBinary(t)
	dir := t.TempDir()
	var images [][]byte
	for _, name := range []string{"a.iso", "b.iso"} {
		path := filepath.Join(dir, name)
		if err := WriteSeed(context.Background(), path, testConfig(t), SeedOptions{AgentBinary: bin, ModTime: seedTime}); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		images = append(images, b)
	}
	if !bytes.Equal(images[0], images[1]) {
		t.Error("the same config gave two different seeds")
	}
}

func TestWriteSeedRefuses(t *testing.T) {
	bin := agentBinary(t)
	script := filepath.Join(t.TempDir(), "agent-vm.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	bad := testConfig(t)
	bad.UID = 0
	tests := []struct {
		name string
		c    Config
		o    SeedOptions
		want string
	}{
		{"invalid config", bad, SeedOptions{AgentBinary: bin, ModTime: seedTime}, "uid 0"},
		{"no binary", testConfig(t), SeedOptions{ModTime: seedTime}, "no agent-vm binary"},
		{"missing binary", testConfig(t), SeedOptions{AgentBinary: "/nonexistent/agent-vm", ModTime: seedTime}, "no such file"},
		{"script for binary", testConfig(t), SeedOptions{AgentBinary: script, ModTime: seedTime}, "linux/amd64"},
		{"no time", testConfig(t), SeedOptions{AgentBinary: bin}, "time is not set"},
		{"extra shadows user-data", testConfig(t), SeedOptions{AgentBinary: bin, ModTime: seedTime,
			Extra: []iso9660.File{{Name: "user-data", Data: []byte("x")}}}, `"user-data" would replace`},
		{"extra shadows the digest", testConfig(t), SeedOptions{AgentBinary: bin, ModTime: seedTime,
			Extra: []iso9660.File{{Name: AgentDigestName, Data: []byte("x")}}}, `"agent-vm.sha256" would replace`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "seed.iso")
			err := WriteSeed(context.Background(), path, tt.c, tt.o)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error containing %q", err, tt.want)
			}
			if _, serr := os.Stat(path); serr == nil {
				t.Error("a refused seed was written anyway")
			}
		})
	}
}
