package size

import (
	"strings"
	"testing"
)

func TestCheckRefusesWhatNoVMCanHave(t *testing.T) {
	h := Host{MemoryMiB: 8192, Threads: 2}
	for _, c := range []struct {
		cpus, mem, disk int
		overcommit      bool
		want            string // "" = accepted
	}{
		{0, 0, 0, false, ""},
		{2, 4096, 20, false, ""},
		{-1, 0, 0, false, "--cpus -1 is out of range"},
		{65, 0, 0, true, "--cpus 65 is out of range"},
		{0, 128, 0, false, "--memory 128 MiB is too small"},
		{0, 0, 1, false, "--disk 1G is smaller than the 2G minimum"},
		{0, 0, 5000, false, "--disk 5000G is out of range (hint: use 2G to 4096G)"},
		{0, 16384, 0, false, "--memory 16 GiB is more than this host's 8 GiB of RAM"},
		{4, 0, 0, false, "--cpus 4 is more than this host's 2 CPU threads"},
		{4, 16384, 0, true, ""},
	} {
		err := Check(c.cpus, c.mem, c.disk, h, c.overcommit)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("Check(%d, %d, %d, overcommit %v): %v, want accepted", c.cpus, c.mem, c.disk, c.overcommit, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("Check(%d, %d, %d, overcommit %v): %v, want %q", c.cpus, c.mem, c.disk, c.overcommit, err, c.want)
		}
	}
}

func TestReadHostSeesThisHost(t *testing.T) {
	h := ReadHost()
	if h.Threads < 1 || h.MemoryMiB < 256 {
		t.Errorf("ReadHost() = %+v: this host has threads and RAM", h)
	}
	if n := DefaultCPUs(); n < 1 || n > 4 || n > h.Threads {
		t.Errorf("DefaultCPUs() = %d on a host with %d threads", n, h.Threads)
	}
}
