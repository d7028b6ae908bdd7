package userconfig

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, File)
	if c, err := Load(path); err != nil || c.OnWait != "" {
		t.Fatalf("no file: %+v, %v", c, err)
	}
	for _, tc := range []struct{ src, want, err string }{
		{"# mine\non_wait = 'notify \"$AGENT_VM_BRANCH\"'\n", `notify "$AGENT_VM_BRANCH"`, ""},
		{"on_wait = 3\n", "", "config.toml:1: on_wait: "},
		{"\non_wiat = 'x'\n", "", `config.toml:2: unknown key "on_wiat" (hint: agent-vm reads on_wait, idle_suspend)`},
		{"idle_suspend = \"30m\"\n", "", ""},
		{"idle_suspend = \"5s\"\n", "", `config.toml:1: idle_suspend "5s" is not a duration of 10s or more (hint: idle_suspend = "30m")`},
		{"idle_suspend = \"soon\"\n", "", `config.toml:1: idle_suspend "soon" is not a duration`},
		{"idle_suspend = 30\n", "", "config.toml:1: idle_suspend: "},
		{"on_wait = \"a\\u0000b\"\n", "", "config.toml:1: on_wait is not a command line"},
		{"on_wait = \n", "", "config.toml:1: "},
	} {
		if err := os.WriteFile(path, []byte(tc.src), 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := Load(path)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: %v, want %q", tc.src, err, tc.err)
		case tc.err == "" && (err != nil || c.OnWait != tc.want):
			t.Errorf("%q: %+v, %v", tc.src, c, err)
		}
	}
	if err := os.WriteFile(path, make([]byte, maxSize+1), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), "is over") {
		t.Errorf("a huge file: %v", err)
	}
	if got := Path(func(k string) string { return map[string]string{"XDG_CONFIG_HOME": "/c", "HOME": "/h"}[k] }); got != "/c/agent-vm/config.toml" {
		t.Errorf("Path = %s", got)
	}
	if got := Path(func(k string) string { return map[string]string{PathEnv: "/x/mine.toml", "XDG_CONFIG_HOME": "/c"}[k] }); got != "/x/mine.toml" {
		t.Errorf("Path with %s: %s", PathEnv, got)
	}
}
