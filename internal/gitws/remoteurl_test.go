package gitws

import "testing"

func TestParseRemote(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Remote
		ok   bool
	}{
		{"https://github.com/o/r.git", Remote{"github.com", "/o/r"}, true},
		{"https://GitHub.com/o/r/", Remote{"github.com", "/o/r"}, true},
		{"https://user@github.com:443/o/r", Remote{"github.com", "/o/r"}, true},
		{"ssh://git@github.com:22/o/r.git", Remote{"github.com", "/o/r"}, true},
		{"git@github.com:o/r.git", Remote{"github.com", "/o/r"}, true},
		{"github.com:/o/r", Remote{"github.com", "/o/r"}, true},
		{"/srv/git/r.git", Remote{}, false},
		{"./r", Remote{}, false},
		{"file:///srv/git/r.git", Remote{}, false},
		{"dir/with:colon", Remote{}, false},
		{"https://github.com/", Remote{}, false},
		{"", Remote{}, false},
	} {
		got, ok := ParseRemote(c.in)
		if got != c.want || ok != c.ok {
			t.Errorf("ParseRemote(%q) = %+v, %v; want %+v, %v", c.in, got, ok, c.want, c.ok)
		}
	}
	if got := (Remote{"github.com", "/o/r"}).HTTPS(); got != "https://github.com/o/r.git" {
		t.Errorf("HTTPS() = %q", got)
	}
}
