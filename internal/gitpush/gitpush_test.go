package gitpush

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

const (
	zero1 = "0000000000000000000000000000000000000000"
	a1    = "1111111111111111111111111111111111111111"
	b1    = "2222222222222222222222222222222222222222"
	zero2 = "0000000000000000000000000000000000000000000000000000000000000000"
	a2    = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	caps  = " report-status side-band-64k quiet object-format=sha1 agent=git/2.39.5"
)

// pkts makes a stream of pkt-lines; "" stands for a flush-pkt.
func pkts(lines ...string) string {
	var b []byte
	for _, l := range lines {
		if l == "" {
			b = append(b, "0000"...)
			continue
		}
		b = appendPkt(b, []byte(l))
	}
	return string(b)
}

func TestReadCommands(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want []Update
		caps []string
	}{
		{"one update", pkts(a1+" "+b1+" refs/heads/feat\x00"+caps, "") + "PACK...",
			[]Update{{a1, b1, "refs/heads/feat"}},
			[]string{"report-status", "side-band-64k", "quiet", "object-format=sha1", "agent=git/2.39.5"}},
		{"create, delete, newline ends", pkts(zero1+" "+b1+" refs/heads/new\x00 report-status\n", a1+" "+zero1+" refs/tags/v1\n", ""),
			[]Update{{zero1, b1, "refs/heads/new"}, {a1, zero1, "refs/tags/v1"}}, []string{"report-status"}},
		{"no capabilities", pkts(a1+" "+b1+" refs/heads/feat", ""), []Update{{a1, b1, "refs/heads/feat"}}, nil},
		{"sha256", pkts(zero2+" "+a2+" refs/heads/feat\x00report-status object-format=sha256", ""),
			[]Update{{zero2, a2, "refs/heads/feat"}}, []string{"report-status", "object-format=sha256"}},
		{"shallow lines first", pkts("shallow "+a1, "shallow "+a2, a1+" "+b1+" refs/heads/feat\x00", ""),
			[]Update{{a1, b1, "refs/heads/feat"}}, nil},
		{"the probe: a flush only", pkts(""), nil, nil},
	} {
		push, replay, err := ReadCommands(strings.NewReader(tc.in))
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if !equalUpdates(push.Updates, tc.want) {
			t.Errorf("%s: updates %q, want %q", tc.name, push.Updates, tc.want)
		}
		if strings.Join(push.Capabilities, ",") != strings.Join(tc.caps, ",") {
			t.Errorf("%s: capabilities %q, want %q", tc.name, push.Capabilities, tc.caps)
		}
		if got, _ := io.ReadAll(replay); string(got) != tc.in {
			t.Errorf("%s: replay %q, want the input %q", tc.name, got, tc.in)
		}
	}
}

func equalUpdates(a, b []Update) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestReadCommandsMalformed(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
	}{
		{"empty body", "", "ends before its command list's flush-pkt"},
		{"no flush", pkts(a1 + " " + b1 + " refs/heads/feat\x00"), "ends before its command list's flush-pkt"},
		{"bad pkt-line", "00zz", "is not 4 hex digits"},
		{"signed push", pkts("push-cert\x00 report-status", "certificate version 0.1\n", ""), "signed pushes are refused"},
		{"two fields", pkts(a1+" "+b1, ""), "is not \"<old-id> <new-id> <ref>\""},
		{"empty ref", pkts(a1+" "+b1+" ", ""), "is not \"<old-id> <new-id> <ref>\""},
		{"empty line", pkts("\n", ""), "is not \"<old-id> <new-id> <ref>\""},
		{"short id", pkts(a1[1:]+" "+b1+" refs/heads/feat", ""), "is not an object id of 40 lowercase hex digits"},
		{"uppercase id", pkts(strings.ToUpper(a2[:40])+" "+b1+" refs/heads/feat", ""), "is not an object id of 40"},
		{"sha256 ids without the capability", pkts(a2+" "+a2+" refs/heads/feat", ""), "is not an object id of 40"},
		{"sha1 ids in a sha256 push", pkts(a1+" "+b1+" refs/heads/feat\x00object-format=sha256", ""), "is not an object id of 64"},
		{"mixed lengths", pkts(a1+" "+a2+" refs/heads/feat", ""), "is not an object id of 40"},
		{"both zero", pkts(zero1+" "+zero1+" refs/heads/feat", ""), "both ids are zero"},
		{"capabilities on a second line", pkts(a1+" "+b1+" refs/heads/a\x00report-status", a1+" "+b1+" refs/heads/b\x00x", ""), "only the first command line may carry capabilities"},
		{"bad shallow", pkts("shallow xyz", ""), "not an object id"},
		{"shallow after a command", pkts(a1+" "+b1+" refs/heads/a", "shallow "+a1, ""), "is not \"<old-id> <new-id> <ref>\""},
		{"too long", pkts(slicesRepeat(a1+" "+b1+" refs/heads/"+strings.Repeat("x", 60000), 20)...), "command list is over 1024 KiB"},
	} {
		_, replay, err := ReadCommands(strings.NewReader(tc.in))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error containing %q", tc.name, err, tc.want)
		}
		if got, _ := io.ReadAll(replay); string(got) != tc.in {
			t.Errorf("%s: the replay after an error is not the input", tc.name)
		}
	}
}

func slicesRepeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

// The pack after the command list is not read by ReadCommands: a reader
// that fails on any read past the flush-pkt proves it.
func TestReadCommandsLeavesThePack(t *testing.T) {
	head := pkts(a1+" "+b1+" refs/heads/feat\x00 report-status", "")
	body := io.MultiReader(strings.NewReader(head), &tripwire{t: t})
	push, replay, err := ReadCommands(body)
	if err != nil || len(push.Updates) != 1 {
		t.Fatalf("got %v, %v", push, err)
	}
	got := make([]byte, len(head))
	if _, err := io.ReadFull(replay, got); err != nil || string(got) != head {
		t.Fatalf("replay began %q (%v), want %q", got, err, head)
	}
}

type tripwire struct{ t *testing.T }

func (w *tripwire) Read(p []byte) (int, error) {
	w.t.Error("ReadCommands read past the command list")
	return 0, errors.New("tripwire")
}

// A pack far larger than memory would allow streams through the replay.
func TestReadCommandsStreamsALargePack(t *testing.T) {
	head := pkts(a1+" "+b1+" refs/heads/feat", "")
	const packSize = 64 << 20
	body := io.MultiReader(strings.NewReader(head), io.LimitReader(zeros{}, packSize))
	_, replay, err := ReadCommands(body)
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, replay)
	if err != nil || n != int64(len(head))+packSize {
		t.Errorf("replayed %d bytes (%v), want %d", n, err, len(head)+packSize)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

func FuzzReadCommands(f *testing.F) {
	f.Add([]byte(pkts(a1+" "+b1+" refs/heads/feat\x00"+caps, "") + "PACK"))
	f.Add([]byte(pkts(zero2+" "+a2+" refs/heads/x\x00object-format=sha256", a2+" "+zero2+" refs/tags/t", "")))
	f.Add([]byte(pkts("shallow "+a1, a1+" "+zero1+" HEAD", "")))
	f.Add([]byte(pkts("push-cert\x00report-status", "")))
	f.Add([]byte("0000"))
	f.Add([]byte("0003"))
	f.Add([]byte("fff0"))
	f.Fuzz(func(t *testing.T, in []byte) {
		push, replay, err := ReadCommands(bytes.NewReader(in))
		got, rerr := io.ReadAll(replay)
		if rerr != nil || !bytes.Equal(got, in) {
			t.Fatalf("the replay is %q (%v), not the input %q", got, rerr, in)
		}
		if err != nil {
			return
		}
		for _, u := range push.Updates {
			if len(u.Old) != len(u.New) || (len(u.Old) != 40 && len(u.Old) != 64) || u.Ref == "" || (u.Create() && u.Delete()) {
				t.Fatalf("accepted a malformed update %q", u)
			}
		}
		_ = CheckBranch(push.Updates, "feat")
	})
}
