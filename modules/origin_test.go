package modules_test

import (
	"context"
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
	"github.com/agent-vm/agent-vm/modules"
)

// originCases are origins both readers of modules.OriginPattern must judge
// alike; want is whether it is an origin.
var originCases = []struct {
	origin string
	want   bool
}{
	{"https://claude.ai", true},
	{"http://localhost:8080", true},
	{"http://127.0.0.1:3000", true},
	{"http://[::1]:8080", true},
	{"https://A.Example.com", true},
	{"https://a-b.example", true},
	{"", false},
	{"https://", false},
	{"https://:8080", false},
	{"https://*", false},
	{`https://a"b`, false},
	{"https://$(id)", false},
	{"https://`id`", false},
	{"http://a,b", false},
	{"https://a b", false},
	{"https://a\nb", false},
	{"https://claude.ai/", false},
	{"https://claude.ai/x", false},
	{"https://claude.ai?x", false},
	{"https://u@claude.ai", false},
	{"HTTPS://claude.ai", false},
	{"ftp://claude.ai", false},
	{"javascript://x", false},
	{"claude.ai", false},
	{"*", false},
	{"null", false},
	{"https://-a", false},
	{"https://a-", false},
	{"https://a_b", false},
	{"https://a:", false},
	{"https://a:123456", false},
	{"http://[::1", false},
	{"http://[]", false},
	{"http://[::1]]", false},
	{"https://${x}", false},
}

func TestCheckOrigin(t *testing.T) {
	for _, c := range originCases {
		err := modules.CheckOrigin("--allow-origin", c.origin)
		if (err == nil) != c.want {
			t.Errorf("CheckOrigin(%q) = %v, want ok=%v", c.origin, err, c.want)
			continue
		}
		if err != nil {
			msg := err.Error()
			if !strings.HasPrefix(msg, "--allow-origin ") || !strings.Contains(msg, "(hint: ") {
				t.Errorf("CheckOrigin(%q): %q does not name the flag and give a hint", c.origin, msg)
			}
			if !strings.Contains(msg, strconv.Quote(c.origin)) {
				t.Errorf("CheckOrigin(%q): %q does not quote the whole input", c.origin, msg)
			}
		}
	}
}

// agent-mcp.nix's allowOrigin type is strMatching of exactly OriginPattern.
func TestModuleUsesOriginPattern(t *testing.T) {
	data, err := fs.ReadFile(modules.FS(), "agent-mcp.nix")
	if err != nil {
		t.Fatal(err)
	}
	option := regexp.MustCompile(`(?s)\ballowOrigin = lib\.mkOption \{.*?type = ([^;]*);`).FindSubmatch(data)
	if option == nil {
		t.Fatal("agent-mcp.nix has no allowOrigin option with a type")
	}
	want := `lib.types.listOf (lib.types.strMatching "` + modules.OriginPattern + `")`
	if got := string(option[1]); got != want {
		t.Errorf("allowOrigin's type is\n  %s\nwant (modules.OriginPattern)\n  %s", got, want)
	}
}

// Nix's builtins.match (what strMatching uses) reads OriginPattern as Go
// does: same verdict on every case.
func TestOriginPatternInNix(t *testing.T) {
	nixInstantiate := tu.Program(t, "nix-instantiate")
	origins := make([]string, len(originCases))
	for i, c := range originCases {
		origins[i] = c.origin
	}
	data, err := json.Marshal(origins)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "origins.json")
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, nixInstantiate, "--eval", "--strict", "--json",
		"--argstr", "pattern", modules.OriginPattern, "--argstr", "file", file, "--expr",
		`{ pattern, file }: map (o: builtins.match pattern o != null) (builtins.fromJSON (builtins.readFile file))`)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("nix-instantiate: %v\n%s", err, stderr.String())
	}
	var got []bool
	if err := json.Unmarshal(out, &got); err != nil || len(got) != len(originCases) {
		t.Fatalf("nix-instantiate printed %s (%v)", out, err)
	}
	for i, c := range originCases {
		if got[i] != c.want {
			t.Errorf("builtins.match on %q = %v, want %v as in Go", c.origin, got[i], c.want)
		}
	}
}
