package scenario

import "testing"

func TestNamesBranch(t *testing.T) {
	for _, c := range []struct {
		msg, name string
		want      bool
	}{
		{`invalid branch name "it's"`, "it's", true},
		{`invalid branch name "new\nline"`, "new\nline", true},
		{`invalid branch name "say\"hi\""`, `say"hi"`, true},
		{`invalid branch name`, "x y", false},
	} {
		if got := namesBranch(c.msg, c.name); got != c.want {
			t.Errorf("namesBranch(%q, %q) = %v", c.msg, c.name, got)
		}
	}
}
