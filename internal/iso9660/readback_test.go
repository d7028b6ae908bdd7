package iso9660

// Helpers that read images back with real tools (xorriso, isoinfo, blkid,
// file). They are test-time tools only; the writer never runs them.

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/testutil"
)

// run runs a program and returns its stdout and stderr, failing the test when
// it exits non-zero.
func run(t testing.TB, path string, args ...string) (stdout, stderr string) {
	t.Helper()
	res, err := execx.OS{}.Run(context.Background(), execx.Cmd{Path: path, Args: args})
	if err != nil {
		t.Fatalf("%v", err)
	}
	return string(res.Stdout), string(res.Stderr)
}

// listed is one file as xorriso's lsdl shows it.
type listed struct {
	mode  string // e.g. "-rwxr-xr-x"
	links int
	uid   int
	gid   int
	size  int64
}

var lsdlLine = regexp.MustCompile(`^(\S+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+.*'/(.*)'$`)

// xorrisoList lists the image's root with xorriso (libisofs, reading Rock
// Ridge) and fails the test if xorriso complains about the image.
func xorrisoList(t testing.TB, image string) map[string]listed {
	t.Helper()
	xorriso := testutil.Program(t, "xorriso")
	out, errOut := run(t, xorriso, "-abort_on", "FAILURE", "-return_with", "WARNING", "32",
		"-indev", image, "-find", "/", "-exec", "lsdl")
	for _, bad := range []string{"WARNING", "FAILURE", "SORRY", "MISHAP"} {
		if strings.Contains(errOut, bad) {
			t.Fatalf("xorriso complains about the image:\n%s", errOut)
		}
	}
	files := map[string]listed{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		m := lsdlLine.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("unexpected xorriso line %q", line)
		}
		if m[6] == "" {
			continue // the root directory
		}
		var l listed
		l.mode = m[1]
		l.links, _ = strconv.Atoi(m[2])
		l.uid, _ = strconv.Atoi(m[3])
		l.gid, _ = strconv.Atoi(m[4])
		l.size, _ = strconv.ParseInt(m[5], 10, 64)
		files[m[6]] = l
	}
	return files
}

// xorrisoExtract copies one file out of the image and returns its bytes.
func xorrisoExtract(t testing.TB, image, name string) []byte {
	t.Helper()
	xorriso := testutil.Program(t, "xorriso")
	dst := filepath.Join(t.TempDir(), "extracted")
	run(t, xorriso, "-osirrox", "on", "-indev", image, "-extract", "/"+name, dst)
	b, err := os.ReadFile(dst)
	if err != nil {
		t.Fatalf("reading what xorriso extracted: %v", err)
	}
	return b
}

// isoinfoNames returns the names isoinfo lists in the root, with Rock Ridge
// (rr true) or the plain ISO 9660 names.
func isoinfoNames(t testing.TB, image string, rr bool) []string {
	t.Helper()
	isoinfo := testutil.Program(t, "isoinfo")
	args := []string{"-l", "-i", image}
	if rr {
		args = append([]string{"-R"}, args...)
	}
	out, _ := run(t, isoinfo, args...)
	var names []string
	for _, line := range strings.Split(out, "\n") {
		// "-rw-r--r--   1    0    0   3 Nov 21 2026 [     30 00]  meta-data "
		i := strings.Index(line, "]  ")
		if i < 0 {
			continue
		}
		name := strings.TrimSuffix(line[i+3:], " ")
		if name != "." && name != ".." {
			names = append(names, name)
		}
	}
	return names
}

func modeString(perm os.FileMode) string {
	return "-" + perm.String()[1:]
}

func writeImage(t testing.TB, v Volume) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "image.iso")
	if err := Write(context.Background(), path, v); err != nil {
		t.Fatalf("Write: %v", err)
	}
	return path
}

func sameBytes(t testing.TB, what string, got, want []byte) {
	t.Helper()
	if !bytes.Equal(got, want) {
		t.Errorf("%s: got %d bytes that differ from the %d written", what, len(got), len(want))
	}
}
