package hostlink

import (
	"fmt"
	"path"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// listScript lists dir ($1) on the host: the host's clock (date +%s), then
// a line per entry, "CTIME NAME" for a regular file and "- NAME" for
// anything else. It prints nothing for a dir that is not there, and exits
// 103 for one that is a symbolic link.
const listScript = `dir=$1
[ -L "$dir" ] && exit 103
[ -e "$dir" ] || exit 0
cd "$dir" || exit 1
date +%s || exit 1
for f in * .[!.]* ..?*; do
	if [ -f "$f" ] && [ ! -L "$f" ]; then
		t=$(stat -c %Z -- "$f") || exit 1
		printf '%s %s\n' "$t" "$f"
	elif [ -e "$f" ] || [ -L "$f" ]; then
		printf '%s %s\n' - "$f"
	fi
done
`

// pgrepScript prints pgrep's exit code for each pattern in its arguments:
// 0 if a process's command line matches it, 1 if none does.
const pgrepScript = `for re; do pgrep -f -- "$re" >/dev/null; echo $?; done`

// sweep removes from dir the copies (but spare) and temporary files last
// installed keep or longer ago, the copies only if no process runs them.
// It reports whether dir is then empty (false if dir is not there).
func (r remote) sweep(dir, spare string, keep time.Duration) (bool, error) {
	res, err := r.exec(nil, script("list", listScript, dir))
	if err != nil {
		return false, err
	}
	switch res.code {
	case 0:
	case 103:
		return false, fmt.Errorf("%q on %s is a symbolic link; agent-vm keeps its binary only in a real directory (hint: give the directory it points to)", dir, r.c.RemoteAddr())
	default:
		return false, r.failed(res, "may the login user read the directory?")
	}
	lines := strings.Split(strings.TrimSuffix(res.stdout, "\n"), "\n")
	if res.stdout == "" {
		return false, nil
	}
	now, err := strconv.ParseInt(lines[0], 10, 64)
	if err != nil {
		return false, r.failed(res, "the host's `date +%s` printed no time")
	}
	var copies, patterns, remove []string
	others := 0
	for _, line := range lines[1:] {
		stamp, name, _ := strings.Cut(line, " ")
		ctime, err := strconv.ParseInt(stamp, 10, 64)
		old := err == nil && time.Duration(now-ctime)*time.Second >= keep
		switch {
		case old && copyName.MatchString(name) && name != spare:
			copies = append(copies, path.Join(dir, name))
			patterns = append(patterns, runPattern(dir, name))
		case old && tmpName.MatchString(name):
			remove = append(remove, path.Join(dir, name))
		default:
			others++
		}
	}
	if len(copies) > 0 {
		res, err := r.exec(nil, script("pgrep", pgrepScript, patterns...))
		if err != nil {
			return false, err
		}
		codes := strings.Fields(res.stdout)
		if res.code != 0 || len(codes) != len(copies) {
			return false, r.failed(res, "is pgrep (procps) on the host working?")
		}
		for i, code := range codes {
			switch code {
			case "0":
				others++ // in use: stays
			case "1":
				remove = append(remove, copies[i])
			default:
				res.code, _ = strconv.Atoi(code)
				return false, r.failed(res, "is pgrep (procps) on the host working?")
			}
		}
	}
	if len(remove) > 0 {
		argv := append([]string{"rm", "-f", "--"}, remove...)
		if _, err := r.must(nil, "may the login user write to the directory?", plain(argv...)); err != nil {
			return false, err
		}
	}
	return others == 0, nil
}

// runPattern is pgrep's extended regular expression for a command line
// naming the copy dir/name. The "[a]" matches the letter but not its own
// text, so the shells that carry the pattern to pgrep (their command lines
// hold it) never count as running the copy.
func runPattern(dir, name string) string {
	return regexp.QuoteMeta(dir+"/") + "[a]" + strings.TrimPrefix(name, "a")
}
