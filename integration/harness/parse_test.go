package harness

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"text/tabwriter"
)

// TestParseTable reads a table laid out by text/tabwriter, as agent-vm's
// list lays it out, including a wide-rune branch and a trailing note.
func TestParseTable(t *testing.T) {
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "BRANCH\tBACKEND\tSTATE\tSSH\tMCP\tCREATED\t")
	fmt.Fprintln(tw, "feat/x\tqemu\tstopped\t2222\t8000\t2026-11-22 00:27\t")
	fmt.Fprintln(tw, "ünï/ветка\tnixos\tcrashed\t2223\t8001\t2026-11-22 00:28\tqemu exited: signal: killed")
	tw.Flush()

	header, rows, err := ParseTable(buf.String())
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(header, ","), "BRANCH,BACKEND,STATE,SSH,MCP,CREATED"; got != want {
		t.Fatalf("header %q, want %q", got, want)
	}
	if len(rows) != 2 {
		t.Fatalf("got %d rows, want 2", len(rows))
	}
	for col, want := range map[string]string{"BRANCH": "ünï/ветка", "BACKEND": "nixos", "STATE": "crashed",
		"SSH": "2223", "MCP": "8001", "CREATED": "2026-11-22 00:28  qemu exited: signal: killed"} {
		if got := rows[1][col]; got != want {
			t.Errorf("row 2 %s = %q, want %q", col, got, want)
		}
	}
	if got := rows[0]["CREATED"]; got != "2026-11-22 00:27" {
		t.Errorf("row 1 CREATED = %q", got)
	}
	if _, _, err := ParseTable("\n"); err == nil {
		t.Error("an empty table parsed")
	}
}

func TestParseSSHConfig(t *testing.T) {
	in := "# agent-vm: branch feat/x\nHost agent-vm-feat-x\n  HostName 127.0.0.1\n  Port 2223\n" +
		"  IdentityFile \"/state/feat x/ssh/id_ed25519\"\n  StrictHostKeyChecking yes\n\nHost agent-vm-b\n  Port 2224\n"
	hosts, err := ParseSSHConfig(in)
	if err != nil {
		t.Fatal(err)
	}
	if len(hosts) != 2 || hosts[0].Name != "agent-vm-feat-x" || hosts[1].Name != "agent-vm-b" {
		t.Fatalf("hosts %+v", hosts)
	}
	o := hosts[0].Options
	if o["hostname"] != "127.0.0.1" || o["port"] != "2223" || o["stricthostkeychecking"] != "yes" {
		t.Errorf("options %+v", o)
	}
	if got := Unquote(o["identityfile"]); got != "/state/feat x/ssh/id_ed25519" {
		t.Errorf("identityfile %q", got)
	}
	for _, bad := range []string{"Port 22\n", "Host x\nPortOnly\n"} {
		if _, err := ParseSSHConfig(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestParseStatusNamesMissingFields(t *testing.T) {
	if _, err := ParseStatus([]byte(`{"branch":"x","state":"stopped"}`), StatusKeys()); err == nil ||
		!strings.Contains(err.Error(), "ports") || !strings.Contains(err.Error(), "created_at") {
		t.Errorf("got %v, want an error naming the missing fields", err)
	}
	st, err := ParseStatus([]byte(`{"branch":"x","pid":42,"ports":{"ssh":2222,"mcp":8000},"mcp":{"url":"u","health_url":"h","token":"t"}}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	if st.Pid != 42 || st.Ports.SSH != 2222 || st.MCP.HealthURL != "h" || st.MCP.Token != "t" {
		t.Errorf("parsed %+v", st)
	}
	if _, err := ParseStatus([]byte(`[]`), nil); err == nil {
		t.Error("an array parsed as a status object")
	}
}
