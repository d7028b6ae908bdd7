package template

import (
	"regexp"
	"strings"
	"testing"
)

// probeOutput is bootIDProbe's output on a real Debian 12 guest (kernel
// 6.1.0-56-amd64, 4 GiB): QEMU's monitor read the boot id's 16 bytes at
// 0x163e95cf0 (xp /16xb), where parseBootIDProbe finds them.
const probeOutput = `26d8ddb9-6d31-437a-a461-0f4e34b06a5a
ffffffffaac00000 D _sdata
ffffffffab510000 B __bss_start
ffffffffac295cf0 b sysctl_bootid
  162800000-162a4897f : Kernel data
  163110000-1641fffff : Kernel bss
`

func TestParseBootIDProbe(t *testing.T) {
	site, err := ParseBootIDProbe(probeOutput)
	if err != nil {
		t.Fatal(err)
	}
	if site.Addr != 0x163e95cf0 || site.ID != "26d8ddb9-6d31-437a-a461-0f4e34b06a5a" {
		t.Fatalf("got %#x %s", site.Addr, site.ID)
	}
	// A symbol in .data is found from _sdata and the data section.
	data := strings.Replace(strings.Replace(probeOutput, " b sysctl_bootid", " d sysctl_bootid", 1), "ffffffffac295cf0", "ffffffffaac00010", 1)
	if site, err := ParseBootIDProbe(data); err != nil || site.Addr != 0x162800010 {
		t.Fatalf("in .data: %v %v", site, err)
	}

	for name, tc := range map[string]struct{ out, want string }{
		"no symbol (no KALLSYMS_ALL)": {strings.Replace(probeOutput, "ffffffffac295cf0 b sysctl_bootid\n", "", 1), "do not name its boot id"},
		"addresses hidden":            {regexp.MustCompile(`(?m)^ffffffff[0-9a-f]{8}`).ReplaceAllString(probeOutput, "0000000000000000"), "do not name its boot id"},
		"a module's symbol only":      {strings.Replace(probeOutput, "b sysctl_bootid", "b sysctl_bootid\t[mod]", 1), "do not name its boot id"},
		"no iomem (not root)":         {strings.Split(probeOutput, "  162800000")[0], `"Kernel bss" in /proc/iomem`},
		"outside the section":         {strings.Replace(probeOutput, "1641fffff", "163110fff", 1), "falls outside"},
		"not a uuid":                  {"nope\n" + probeOutput[37:], "not a UUID"},
		"nothing":                     {"", "not a UUID"},
	} {
		if _, err := ParseBootIDProbe(tc.out); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error with %q", name, err, tc.want)
		}
	}
}

func TestCloneEdits(t *testing.T) {
	site := &BootIDSite{Addr: 0x1000, ID: "26d8ddb9-6d31-437a-a461-0f4e34b06a5a"}
	edits1, id1, err := CloneEdits(site)
	if err != nil || len(edits1) != 1 {
		t.Fatalf("edits %+v, %v; want one", edits1, err)
	}
	edits2, id2, _ := CloneEdits(site)
	e1, e2 := edits1[0], edits2[0]
	if id1 == id2 || string(e1.New) == string(e2.New) {
		t.Fatal("two clones got the same boot id")
	}
	if e1.Addr != 0x1000 || len(e1.Old) != 16 || e1.Old[0] != 0x26 || e1.Old[15] != 0x5a {
		t.Fatalf("edit %+v", e1)
	}
	if b, _ := bootIDBytes(id1); string(b) != string(e1.New) || e1.New[6]>>4 != 4 || e1.New[8]>>6 != 2 {
		t.Fatalf("the new id %s is not the bytes written (%x) or not a version 4 UUID", id1, e1.New)
	}
	if _, _, err := CloneEdits(&BootIDSite{ID: "x"}); err == nil {
		t.Fatal("a template with a broken id: no error")
	}
	if edits, id, err := CloneEdits(nil); edits != nil || id != "" || err != nil {
		t.Fatalf("a template without a boot id's site: %+v, %q, %v; want no edit", edits, id, err)
	}
}
