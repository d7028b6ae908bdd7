package template

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/hostdir"
)

func TestHintIsGivenOncePerHost(t *testing.T) {
	dir := &hostdir.Dir{Path: filepath.Join(t.TempDir(), "templates"), Mode: 0o700, Place: hostdir.InXDG}
	ts := Templates{Dir: dir}
	if h := ts.Hint(false, time.Minute); h != "" {
		t.Errorf("a VM that could not start from a template got the hint: %q", h)
	}
	h := ts.Hint(true, 83*time.Second+400*time.Millisecond)
	if !strings.Contains(h, "SSH after 1m23s") || !strings.Contains(h, "`agent-vm template build`") {
		t.Errorf("the first cold boot's hint: %q", h)
	}
	if again := ts.Hint(true, time.Minute); again != "" {
		t.Errorf("the hint was given twice: %q", again)
	}
	if h := (Templates{}).Hint(true, time.Minute); h != "" {
		t.Errorf("with templates off, no hint: %q", h)
	}
}
