package gitpush

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// decode reads a receive-pack answer: the lines of the progress band and
// the report's lines (demultiplexed from the data band when sideBand),
// checking every packet against max bytes of data.
func decode(t *testing.T, body string, sideBand bool, max int) (progress, report []string) {
	t.Helper()
	pr := &pktReader{r: strings.NewReader(body)}
	var data strings.Builder
	for {
		line, err := pr.next()
		if errors.Is(err, errFlush) || errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("the answer is not pkt-lines: %v", err)
		}
		if !sideBand {
			report = append(report, string(line))
			continue
		}
		if len(line) > max+1 {
			t.Errorf("a side-band packet of %d bytes, over %d", len(line), max+1)
		}
		switch line[0] {
		case bandProgress:
			progress = append(progress, string(line[1:]))
		case bandData:
			data.WriteString(string(line[1:]))
		default:
			t.Fatalf("band %d", line[0])
		}
	}
	if sideBand {
		progress2, lines := decode(t, data.String(), false, 0)
		if progress2 != nil {
			t.Fatal("progress inside the data band")
		}
		report = lines
	}
	return progress, report
}

func TestWriteRefusal(t *testing.T) {
	updates := []Update{{a1, b1, "refs/heads/feat"}, {a1, b1, "refs/heads/main"}}
	refusal := CheckBranch(updates, "feat")
	wantReport := []string{
		"unpack ok\n",
		"ng refs/heads/feat refused: another ref of this push is not allowed\n",
		`ng refs/heads/main this VM may push only to its own branch "feat", not "main" (hint: git push origin HEAD:feat)` + "\n",
	}
	for _, tc := range []struct {
		name     string
		caps     []string
		sideBand bool
		max      int
	}{
		{"side-band-64k", []string{"report-status", "side-band-64k"}, true, maxPktLen - 5},
		{"side-band", []string{"report-status-v2", "side-band"}, true, 999},
		{"no side-band", []string{"report-status"}, false, 0},
	} {
		rec := httptest.NewRecorder()
		WriteRefusal(rec, Push{Updates: updates, Capabilities: tc.caps}, refusal)
		if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "application/x-git-receive-pack-result" {
			t.Errorf("%s: status %d, type %q", tc.name, rec.Code, rec.Header().Get("Content-Type"))
		}
		progress, report := decode(t, rec.Body.String(), tc.sideBand, tc.max)
		if strings.Join(report, "") != strings.Join(wantReport, "") {
			t.Errorf("%s: report %q, want %q", tc.name, report, wantReport)
		}
		if tc.sideBand && (len(progress) != 1 || progress[0] != refusal.Error()+"\n") {
			t.Errorf("%s: progress %q, want the error's message", tc.name, progress)
		}
	}
}

// Without report-status git would read no report: a 403 at least fails it.
func TestWriteRefusalNoReportStatus(t *testing.T) {
	rec := httptest.NewRecorder()
	err := errors.New("push refused: x")
	WriteRefusal(rec, Push{Updates: []Update{{a1, b1, "refs/heads/x"}}, Capabilities: []string{"side-band-64k"}}, err)
	if rec.Code != http.StatusForbidden || rec.Body.String() != "push refused: x\n" {
		t.Errorf("got %d %q, want 403 with the message", rec.Code, rec.Body.String())
	}
}

// A request that could not be read has no updates to report on: the
// message goes in the report alone, one line, the control characters of
// what the guest sent made spaces.
func TestWriteRefusalUnreadable(t *testing.T) {
	rec := httptest.NewRecorder()
	WriteRefusal(rec, Push{Capabilities: []string{"report-status", "side-band-64k"}}, errors.New("bad\x1b[2J\nsecond line"))
	progress, report := decode(t, rec.Body.String(), true, maxPktLen-5)
	if strings.Join(progress, "|") != "bad [2J\n|second line\n" || strings.Join(report, "|") != "unpack ok\n" {
		t.Errorf("progress %q, report %q", progress, report)
	}
}

// A reason or message too long for a packet is cut, not split or sent
// oversized.
func TestWriteRefusalLong(t *testing.T) {
	ref := "refs/heads/" + strings.Repeat("r", 65000)
	long := errors.New(strings.Repeat("m", 200000))
	for _, caps := range [][]string{{"report-status", "side-band-64k"}, {"report-status", "side-band"}, {"report-status"}} {
		rec := httptest.NewRecorder()
		WriteRefusal(rec, Push{Updates: []Update{{a1, b1, ref}}, Capabilities: caps}, long)
		sideBand := len(caps) > 1
		size := maxPktLen - 5
		if sideBand && caps[1] == "side-band" {
			size = 999
		}
		_, report := decode(t, rec.Body.String(), sideBand, size)
		if len(report) != 2 || !strings.HasPrefix(report[1], "ng "+ref+" mmm") || !strings.HasSuffix(report[1], "m\n") {
			t.Errorf("%q: the report is not one cut ng line", caps)
		}
	}
}
