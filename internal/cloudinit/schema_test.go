package cloudinit

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestGoldensPassCloudInitSchema validates every golden user-data (and a
// fresh rendering of each case) with Debian's cloud-init.
func TestGoldensPassCloudInitSchema(t *testing.T) {
	rootfs := cloudInitRootfs(t)
	goldens, err := filepath.Glob(filepath.Join("testdata", "golden", "*", "user-data"))
	if err != nil || len(goldens) == 0 {
		t.Fatalf("no golden user-data found (%v)", err)
	}
	docs := map[string][]byte{}
	for _, g := range goldens {
		b, err := os.ReadFile(g)
		if err != nil {
			t.Fatal(err)
		}
		docs[g] = b
	}
	for name, c := range goldenCases(t) {
		seed, err := Render(c)
		if err != nil {
			t.Fatal(err)
		}
		docs["rendered "+name] = seed.UserData
	}
	for name, ud := range docs {
		r := cloudInitSchema(t, rootfs, ud)
		if !r.valid || !strings.Contains(r.output, "Valid cloud-config") {
			t.Errorf("%s: cloud-init schema rejects it:\n%s", name, r.output)
		}
		if strings.Contains(strings.ToLower(r.output), "deprecat") {
			t.Errorf("%s: cloud-init schema reports deprecated settings:\n%s", name, r.output)
		}
	}
}

// TestCloudInitSchemaCanFail proves the validator above is not a rubber
// stamp: it rejects user-data that is wrong in ways we could get wrong.
func TestCloudInitSchemaCanFail(t *testing.T) {
	rootfs := cloudInitRootfs(t)
	seed, err := Render(testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	body := bytes.TrimPrefix(seed.UserData, []byte("#cloud-config\n"))
	mutations := map[string]func(map[string]any){
		// The schema needs at least one key type; "no generation" is
		// spelled [ed25519] plus a supplied key.
		"empty ssh_genkeytypes": func(m map[string]any) { m["ssh_genkeytypes"] = []any{} },
		"runcmd not a list":     func(m map[string]any) { m["runcmd"] = 42 },
		"uid not a number":      func(m map[string]any) { m["users"].([]any)[0].(map[string]any)["uid"] = []any{"x"} },
	}
	for name, mutate := range mutations {
		var m map[string]any
		if err := json.Unmarshal(body, &m); err != nil {
			t.Fatal(err)
		}
		mutate(m)
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		r := cloudInitSchema(t, rootfs, append([]byte("#cloud-config\n"), b...))
		if r.valid {
			t.Errorf("%s: cloud-init schema accepts it:\n%s", name, r.output)
		}
		t.Logf("%s: %s", name, strings.TrimSpace(r.output))
	}
}

// TestNetworkConfigRendersToNetworkd has cloud-init turn the network config
// into the systemd-networkd file the guest will use. (In the chroot there is
// no NIC with that MAC, so the name stays nic0; in the guest cloud-init looks
// the MAC up and writes the NIC's real name.)
func TestNetworkConfigRendersToNetworkd(t *testing.T) {
	rootfs := cloudInitRootfs(t)
	c := testConfig(t)
	c.MACAddress = "52:54:00:ab:cd:ef"
	seed, err := Render(c)
	if err != nil {
		t.Fatal(err)
	}
	tmp, err := os.MkdirTemp(filepath.Join(rootfs, "tmp"), "netcfg-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	if err := os.WriteFile(filepath.Join(tmp, "network-config"), seed.NetworkConfig, 0o644); err != nil {
		t.Fatal(err)
	}
	inside := "/tmp/" + filepath.Base(tmp)
	inRootfs(t, rootfs, "cloud-init", "devel", "net-convert", "--network-data", inside+"/network-config",
		"--kind", "yaml", "--distro", "debian", "--output-kind", "networkd", "--directory", inside+"/out")
	got, err := os.ReadFile(filepath.Join(tmp, "out", "etc", "systemd", "network", "10-cloud-init-nic0.network"))
	if err != nil {
		t.Fatalf("cloud-init wrote no networkd file for the NIC: %v", err)
	}
	for _, want := range []string{"[Match]\n", "MACAddress=52:54:00:ab:cd:ef\n", "[Network]\n", "DHCP=ipv4\n"} {
		if !strings.Contains(string(got), want) {
			t.Errorf("networkd file lacks %q:\n%s", want, got)
		}
	}
}
