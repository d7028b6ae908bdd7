package gitws

import (
	"net/url"
	"strings"
)

// Remote is a git remote's host and repository path, whichever form its
// URL takes: https://host/o/r.git, ssh://git@host:22/o/r, or the scp-like
// git@host:o/r.
type Remote struct {
	Host string // lower case, no port
	Path string // "/o/r", without a final ".git" or slash
}

// ParseRemote reads a network remote's URL; ok is false for a local path,
// a file:// URL or anything it cannot read.
func ParseRemote(raw string) (r Remote, ok bool) {
	raw = strings.TrimSpace(raw)
	if i := strings.Index(raw, "://"); i > 0 {
		u, err := url.Parse(raw)
		if err != nil {
			return Remote{}, false
		}
		switch u.Scheme {
		case "https", "http", "ssh", "git", "git+ssh", "ssh+git":
		default:
			return Remote{}, false
		}
		r = Remote{Host: u.Hostname(), Path: u.Path}
	} else {
		// scp-like: [user@]host:path, where host has no slash before the
		// colon (git's own rule: a path with a slash first is local).
		colon := strings.Index(raw, ":")
		if colon <= 0 || strings.Contains(raw[:colon], "/") {
			return Remote{}, false
		}
		host := raw[:colon]
		if at := strings.LastIndex(host, "@"); at >= 0 {
			host = host[at+1:]
		}
		r = Remote{Host: host, Path: "/" + strings.TrimPrefix(raw[colon+1:], "/")}
	}
	r.Host = strings.ToLower(r.Host)
	r.Path = strings.TrimSuffix(strings.TrimRight(r.Path, "/"), ".git")
	if r.Host == "" || r.Path == "" || r.Path == "/" {
		return Remote{}, false
	}
	return r, true
}

// HTTPS is the remote's https URL (git's smart HTTP), the form a
// credential the egress proxy adds can reach.
func (r Remote) HTTPS() string { return "https://" + r.Host + r.Path + ".git" }
