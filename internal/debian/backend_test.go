package debian

import (
	"context"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/state"
)

// Without --image, create already knows the base the first start will use
// (the built default, 4 GiB, when there is none yet): a smaller --disk is
// refused now, not at every start.
func TestProvisionRefusesADiskSmallerThanTheDefaultImage(t *testing.T) {
	b := &Backend{Run: execx.OS{}, ImageDir: t.TempDir()}
	for disk, want := range map[int]string{3: "--disk 3G is smaller than the default base image (4 GiB) (hint: leave --disk out, or give at least 4G)", 4: "", 20: ""} {
		err := b.Provision(context.Background(), state.Layout{Dir: t.TempDir()}, &state.Record{Resources: state.Resources{DiskGiB: disk}}, backend.CreateFlags{})
		if got := ""; err != nil {
			got = err.Error()
			if want == "" || !strings.Contains(got, want) {
				t.Errorf("--disk %dG: got %q, want %q", disk, got, want)
			}
		} else if want != "" {
			t.Errorf("--disk %dG: no error, want %q", disk, want)
		}
	}
}
