package iso9660

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// FuzzImageReadsBack writes images with fuzzed names and sizes and checks that
// the real readers (xorriso, isoinfo) see exactly those files. Invalid names
// must be refused rather than written.
//
//	go test ./internal/iso9660 -run '^$' -fuzz FuzzImageReadsBack -fuzztime 20000x
//
// (a count, not a duration: with a duration, Go 1.26's fuzz coordinator can
// fail at the deadline with "context deadline exceeded", golang/go#75804)
func FuzzImageReadsBack(f *testing.F) {
	f.Add("user-data/meta-data/network-config/agent-vm", uint16(3000))
	f.Add("a/A/a.b.c/.x/x./-/_", uint16(0))
	f.Add("same-prefix-1/same-prefix-2/same-prefix-3/same-prefix-4/same-prefix-5/same-prefix-6/same-prefix-7/same-prefix-8/same-prefix-9/same-prefix-10", uint16(2049))
	f.Add(strings.Repeat("n", MaxNameLen)+"/x", uint16(65535))
	f.Add("bad name/ok", uint16(1))
	f.Add("ünïcode", uint16(1))
	f.Fuzz(func(t *testing.T, joined string, sizeSeed uint16) {
		names := strings.Split(joined, "/")
		if len(names) > 40 {
			names = names[:40]
		}
		v := Volume{ID: "fuzz", ModTime: fixedTime}
		valid, seen := true, map[string]bool{}
		for i, name := range names {
			if ValidName(name) != nil || seen[name] {
				valid = false
			}
			seen[name] = true
			size := (int(sizeSeed) * (i + 1)) % 70000
			data := make([]byte, size)
			for j := range data {
				data[j] = byte(i + j)
			}
			v.Files = append(v.Files, File{Name: name, Data: data, Mode: 0o640})
		}
		path := filepath.Join(t.TempDir(), "fuzz.iso")
		err := Write(context.Background(), path, v)
		if !valid {
			if err == nil {
				t.Fatalf("names %q include an invalid or repeated one, yet Write accepted them", names)
			}
			return
		}
		if err != nil {
			t.Fatalf("Write(%q): %v", names, err)
		}
		files := xorrisoList(t, path)
		if len(files) != len(v.Files) {
			t.Fatalf("xorriso lists %d files, want %d: %v", len(files), len(v.Files), files)
		}
		for _, f := range v.Files {
			got, ok := files[f.Name]
			if !ok || got.size != int64(len(f.Data)) || got.mode != "-rw-r-----" {
				t.Errorf("%q: got %+v (listed %v), want size %d mode -rw-r-----", f.Name, got, ok, len(f.Data))
			}
		}
		last := v.Files[len(v.Files)-1]
		sameBytes(t, last.Name, xorrisoExtract(t, path, last.Name), last.Data)
		rr := isoinfoNames(t, path, true)
		want := slices.Sorted(func(yield func(string) bool) {
			for _, f := range v.Files {
				if !yield(f.Name) {
					return
				}
			}
		})
		slices.Sort(rr)
		if !slices.Equal(rr, want) {
			t.Errorf("isoinfo -R names: got %q, want %q", rr, want)
		}
	})
}
