package iso9660

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/testutil"
)

var fixedTime = time.Date(2026, 11, 21, 10, 30, 0, 0, time.UTC)

// seedLike is the shape of a NoCloud seed: long lowercase names with '-',
// one private file, one executable streamed from disk.
func seedLike(t testing.TB, binarySize int) (Volume, []byte) {
	t.Helper()
	bin := make([]byte, binarySize)
	if _, err := rand.Read(bin); err != nil {
		t.Fatal(err)
	}
	binPath := filepath.Join(t.TempDir(), "agent-vm")
	if err := os.WriteFile(binPath, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	return Volume{
		ID:      "cidata",
		ModTime: fixedTime,
		Files: []File{
			{Name: "user-data", Data: []byte("#cloud-config\n{\"hostname\":\"x\"}\n"), Mode: 0o600},
			{Name: "meta-data", Data: []byte("{\"instance-id\":\"i-1\"}\n")},
			{Name: "network-config", Data: []byte("{\"version\":2}\n"), Mode: 0o644},
			{Name: "agent-vm", SourcePath: binPath, Mode: 0o755},
		},
	}, bin
}

func TestSeedReadsBackWithRockRidge(t *testing.T) {
	// 15 MB like the agent-vm binary, plus an odd tail so the last sector is
	// partly padding.
	v, bin := seedLike(t, 15<<20+123)
	image := writeImage(t, v)

	files := xorrisoList(t, image)
	want := map[string]listed{
		"user-data":      {mode: "-rw-------", links: 1, size: int64(len(v.Files[0].Data))},
		"meta-data":      {mode: "-rw-r--r--", links: 1, size: int64(len(v.Files[1].Data))},
		"network-config": {mode: "-rw-r--r--", links: 1, size: int64(len(v.Files[2].Data))},
		"agent-vm":       {mode: "-rwxr-xr-x", links: 1, size: int64(len(bin))},
	}
	if len(files) != len(want) {
		t.Errorf("xorriso lists %v, want exactly %d files", files, len(want))
	}
	for name, w := range want {
		got, ok := files[name]
		if !ok {
			t.Errorf("xorriso does not list %q (Rock Ridge name lost?); it lists %v", name, files)
			continue
		}
		if got != w {
			t.Errorf("%s: got %+v, want %+v", name, got, w)
		}
	}
	for _, f := range v.Files[:3] {
		sameBytes(t, f.Name, xorrisoExtract(t, image, f.Name), f.Data)
	}
	sameBytes(t, "agent-vm", xorrisoExtract(t, image, "agent-vm"), bin)

	// isoinfo is a second, independent reader.
	rr := isoinfoNames(t, image, true)
	slices.Sort(rr)
	if want := []string{"agent-vm", "meta-data", "network-config", "user-data"}; !slices.Equal(rr, want) {
		t.Errorf("isoinfo -R names: got %q, want %q", rr, want)
	}
	plain := isoinfoNames(t, image, false)
	if want := []string{"AGENT_VM.;1", "META_DAT.;1", "NETWORK_.;1", "USER_DAT.;1"}; !slices.Equal(plain, want) {
		t.Errorf("isoinfo ISO 9660 names: got %q, want %q (sorted, as ECMA-119 requires)", plain, want)
	}
}

func TestVolumeIdentity(t *testing.T) {
	v, _ := seedLike(t, 10)
	image := writeImage(t, v)

	blkid := testutil.Program(t, "blkid")
	label, _ := run(t, blkid, "-o", "value", "-s", "LABEL", image)
	if strings.TrimSpace(label) != "cidata" {
		t.Errorf("blkid LABEL: got %q, want cidata", label)
	}
	typ, _ := run(t, blkid, "-o", "value", "-s", "TYPE", image)
	if strings.TrimSpace(typ) != "iso9660" {
		t.Errorf("blkid TYPE: got %q, want iso9660", typ)
	}

	file := testutil.Program(t, "file")
	desc, _ := run(t, file, "-b", image)
	if !strings.Contains(desc, "ISO 9660") || !strings.Contains(desc, "'cidata'") {
		t.Errorf("file says %q, want an ISO 9660 filesystem labelled 'cidata'", desc)
	}

	isoinfo := testutil.Program(t, "isoinfo")
	info, _ := run(t, isoinfo, "-d", "-i", image)
	for _, want := range []string{
		"Volume id: cidata",
		"Logical block size is: 2048",
		"Rock Ridge signatures version 1 found",
	} {
		if !strings.Contains(info, want) {
			t.Errorf("isoinfo -d lacks %q:\n%s", want, info)
		}
	}
	st, err := os.Stat(image)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("Volume size is: %d\n", st.Size()/SectorSize); !strings.Contains(info, want) {
		t.Errorf("isoinfo -d lacks %q (the file is %d bytes):\n%s", want, st.Size(), info)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("image mode: got %v, want 0600 (it carries secrets)", st.Mode().Perm())
	}
}

func TestShortNamesAreUniqueLevel1Names(t *testing.T) {
	v := Volume{ID: "cidata", ModTime: fixedTime, Files: []File{
		{Name: "user-data", Data: []byte("a")},
		{Name: "user-datb", Data: []byte("b")},
		{Name: "User-Data", Data: []byte("c")},
		{Name: "archive.tar.gz", Data: []byte("d")},
		{Name: ".hidden", Data: []byte("e")},
		{Name: "a-very-long-name-indeed", Data: []byte("f")},
		{Name: "empty"},
	}}
	image := writeImage(t, v)
	plain := isoinfoNames(t, image, false)
	want := []string{"ARCHIVE_.GZ;1", "A_VERY_L.;1", "EMPTY.;1", "USER_DA1.;1", "USER_DA2.;1", "USER_DAT.;1", "_HIDDEN.;1"}
	if !slices.Equal(plain, want) {
		t.Errorf("ISO 9660 names: got %q, want %q", plain, want)
	}
	files := xorrisoList(t, image)
	for _, f := range v.Files {
		if _, ok := files[f.Name]; !ok {
			t.Errorf("Rock Ridge name %q missing; xorriso lists %v", f.Name, files)
			continue
		}
		sameBytes(t, f.Name, xorrisoExtract(t, image, f.Name), f.Data)
	}
}

func TestManyFilesSpanSeveralDirectorySectors(t *testing.T) {
	v := Volume{ID: "many", ModTime: fixedTime}
	for i := 0; i < 60; i++ {
		name := fmt.Sprintf("%03d-%s", i, strings.Repeat("x", MaxNameLen-4))
		v.Files = append(v.Files, File{Name: name, Data: []byte(name)})
	}
	l, err := plan(v)
	if err != nil {
		t.Fatal(err)
	}
	if l.rootSectors < 3 {
		t.Fatalf("root directory has %d sectors; this test needs several", l.rootSectors)
	}
	image := writeImage(t, v)
	files := xorrisoList(t, image)
	if len(files) != len(v.Files) {
		t.Errorf("xorriso lists %d files, want %d", len(files), len(v.Files))
	}
	for _, f := range v.Files {
		if got, ok := files[f.Name]; !ok || got.size != int64(len(f.Data)) {
			t.Errorf("%s: got %+v (listed %v), want size %d", f.Name, got, ok, len(f.Data))
		}
	}
	sameBytes(t, v.Files[59].Name, xorrisoExtract(t, image, v.Files[59].Name), v.Files[59].Data)
}

func TestOutputIsDeterministic(t *testing.T) {
	v, _ := seedLike(t, 5000)
	encode := func(v Volume) []byte {
		var b bytes.Buffer
		if _, err := Encode(context.Background(), &b, v); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	a := encode(v)
	reordered := v
	reordered.Files = slices.Clone(v.Files)
	slices.Reverse(reordered.Files)
	if !bytes.Equal(a, encode(reordered)) {
		t.Error("the same files in another order gave different bytes")
	}
	if len(a)%SectorSize != 0 {
		t.Errorf("image is %d bytes, not whole sectors", len(a))
	}
	later := v
	later.ModTime = fixedTime.Add(time.Second)
	if bytes.Equal(a, encode(later)) {
		t.Error("a different ModTime gave the same bytes; timestamps are not taken from the input")
	}
}

func TestInvalidVolumes(t *testing.T) {
	ok := File{Name: "user-data", Data: []byte("x")}
	tests := []struct {
		name string
		v    Volume
		want string
	}{
		{"empty id", Volume{ModTime: fixedTime}, "volume id"},
		{"long id", Volume{ID: strings.Repeat("a", 33), ModTime: fixedTime}, "1 to 32"},
		{"id with space", Volume{ID: "ci data", ModTime: fixedTime}, "volume id"},
		{"no time", Volume{ID: "cidata", Files: []File{ok}}, "time is not set"},
		{"time too early", Volume{ID: "cidata", ModTime: time.Date(1969, 1, 1, 0, 0, 0, 0, time.UTC)}, "1970-2155"},
		{"empty name", Volume{ID: "cidata", ModTime: fixedTime, Files: []File{{Name: ""}}}, "empty"},
		{"slash", Volume{ID: "cidata", ModTime: fixedTime, Files: []File{{Name: "a/b"}}}, `contains '/'`},
		{"dotdot", Volume{ID: "cidata", ModTime: fixedTime, Files: []File{{Name: ".."}}}, "reserved"},
		{"too long", Volume{ID: "cidata", ModTime: fixedTime, Files: []File{{Name: strings.Repeat("a", MaxNameLen+1)}}}, "bytes long"},
		{"twice", Volume{ID: "cidata", ModTime: fixedTime, Files: []File{ok, ok}}, "twice"},
		{"setuid", Volume{ID: "cidata", ModTime: fixedTime, Files: []File{{Name: "x", Mode: 0o755 | fs.ModeSetuid}}}, "other than permissions"},
		{"both sources", Volume{ID: "cidata", ModTime: fixedTime, Files: []File{{Name: "x", Data: []byte{1}, SourcePath: "/etc/hostname"}}}, "set one"},
		{"missing source", Volume{ID: "cidata", ModTime: fixedTime, Files: []File{{Name: "x", SourcePath: "/nonexistent/agent-vm"}}}, "no such file"},
		{"directory source", Volume{ID: "cidata", ModTime: fixedTime, Files: []File{{Name: "x", SourcePath: "/"}}}, "not a regular file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "seed.iso")
			err := Write(context.Background(), path, tt.v)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got error %v, want one containing %q", err, tt.want)
			}
			if _, serr := os.Stat(path); !errors.Is(serr, fs.ErrNotExist) {
				t.Errorf("a failed write left %s behind", path)
			}
		})
	}
}

func TestFailedWriteKeepsOldImageAndLeavesNoTemp(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "seed.iso")
	if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	v, _ := seedLike(t, 1<<20)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Write(ctx, path, v); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "old" {
		t.Errorf("the old image was replaced by %d bytes", len(b))
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries after a failed write, want only the old image", len(entries))
	}
}

func TestSourceThatChangesSizeIsAnError(t *testing.T) {
	src := filepath.Join(t.TempDir(), "bin")
	if err := os.WriteFile(src, make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := plan(Volume{ID: "x", ModTime: fixedTime, Files: []File{{Name: "bin", SourcePath: src}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, size := range []int{100, 8192} {
		if err := os.WriteFile(src, make([]byte, size), 0o644); err != nil {
			t.Fatal(err)
		}
		err := writeContents(context.Background(), &bytes.Buffer{}, l.entries[0])
		if err == nil || !strings.Contains(err.Error(), "while the image was written") {
			t.Errorf("source resized to %d: got %v, want an error about the change", size, err)
		}
	}
}
