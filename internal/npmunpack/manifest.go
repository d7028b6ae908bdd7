package npmunpack

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strings"
	"time"
)

// manifest is the registry's document of one version of a package: the
// fields of its package.json that say what npm does at install, and dist.
type manifest struct {
	Name                 string                             `json:"name"`
	Version              string                             `json:"version"`
	Dependencies         map[string]string                  `json:"dependencies"`
	OptionalDependencies map[string]string                  `json:"optionalDependencies"`
	PeerDependencies     map[string]string                  `json:"peerDependencies"`
	PeerDependenciesMeta map[string]struct{ Optional bool } `json:"peerDependenciesMeta"`
	Scripts              map[string]string                  `json:"scripts"`
	Bin                  json.RawMessage                    `json:"bin"`
	Man                  json.RawMessage                    `json:"man"`
	Directories          struct{ Bin, Man string }          `json:"directories"`
	GypFile              bool                               `json:"gypfile"`
	OS                   stringList                         `json:"os"`
	CPU                  stringList                         `json:"cpu"`
	Libc                 stringList                         `json:"libc"`
	Dist                 struct {
		Tarball   string `json:"tarball"`
		Integrity string `json:"integrity"`
	} `json:"dist"`

	// bins are its programs: link name to path in the package.
	bins map[string]string
}

// stringList is a package.json list that may also be one string.
type stringList []string

func (l *stringList) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*l = stringList{one}
		return nil
	}
	return json.Unmarshal(b, (*[]string)(l))
}

// installScripts are the scripts npm runs when it installs a package from
// a registry (prepare runs only for git and directory installs).
var installScripts = []string{"preinstall", "install", "postinstall"}

// plain says whether npm would do nothing for m but unpack it and link
// its programs, on a machine of os, cpu and libc.
func (m *manifest) plain(os, cpu, libc string) error {
	switch {
	case len(m.Dependencies) > 0 || len(m.OptionalDependencies) > 0:
		return needsNPM("it has dependencies")
	case slices.ContainsFunc(installScripts, func(s string) bool { return m.Scripts[s] != "" }):
		return needsNPM("it has install scripts")
	case m.GypFile:
		return needsNPM("it builds native code")
	case len(m.Man) > 0 && string(m.Man) != "null" || m.Directories.Bin != "" || m.Directories.Man != "":
		return needsNPM("it has man pages or a bin directory")
	case !allows(m.OS, os) || !allows(m.CPU, cpu) || !allows(m.Libc, libc):
		return needsNPM("it is for os %v, cpu %v, libc %v, not %s %s %s", m.OS, m.CPU, m.Libc, os, cpu, libc)
	}
	for p := range m.PeerDependencies {
		if !m.PeerDependenciesMeta[p].Optional {
			return needsNPM("it has peer dependencies")
		}
	}
	bins, err := readBins(m.Name, m.Bin)
	if err != nil {
		return err
	}
	m.bins = bins
	if !strings.HasPrefix(m.Dist.Integrity, "sha512-") && !strings.Contains(m.Dist.Integrity, " sha512-") {
		return needsNPM("the registry gives no sha512 integrity for it")
	}
	return nil
}

// allows is npm's check of a package's os, cpu or libc list against this
// machine's: an empty list allows every one, a !name refuses that one,
// otherwise the list must name it.
func allows(list []string, have string) bool {
	if len(list) == 0 {
		return true
	}
	named := false
	for _, v := range list {
		if v == "!"+have {
			return false
		}
		if !strings.HasPrefix(v, "!") {
			named = true
			if v == have {
				return true
			}
		}
	}
	return !named
}

// readBins reads a package.json bin: one path (the program is named as
// the package, less its scope) or names to paths. Names and paths that
// would leave the package's directory or PREFIX/bin are refused.
func readBins(name string, raw json.RawMessage) (map[string]string, error) {
	bins := map[string]string{}
	if len(raw) == 0 || string(raw) == "null" {
		return bins, nil
	}
	var one string
	if err := json.Unmarshal(raw, &one); err == nil {
		bins[path.Base(name)] = one
	} else if err := json.Unmarshal(raw, &bins); err != nil {
		return nil, needsNPM("its bin is neither a path nor names to paths")
	}
	for b, p := range bins {
		clean := path.Clean("/" + p)[1:]
		if b == "" || strings.ContainsAny(b, "/\\") || b == "." || b == ".." || clean == "" || clean != strings.TrimPrefix(path.Clean(p), "./") {
			return nil, needsNPM("its program %q at %q is not a plain name and a path in the package", b, p)
		}
		bins[b] = clean
	}
	return bins, nil
}

// manifestTimeout bounds the fetch of one manifest.
const manifestTimeout = 2 * time.Minute

// manifest fetches name's manifest at version (a release or a dist-tag)
// from the registry.
func (u Unpacker) manifest(ctx context.Context, name, version string) (*manifest, error) {
	ctx, cancel := context.WithTimeout(ctx, manifestTimeout)
	defer cancel()
	// The registry's name of a scoped package escapes its slash.
	where := u.Config.Registry + strings.Replace(name, "/", "%2f", 1) + "/" + url.PathEscape(version)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, where, nil)
	if err != nil {
		return nil, fmt.Errorf("asking the registry for %s@%s: %w", name, version, err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := u.client().Do(req)
	if err != nil {
		return nil, fmt.Errorf("asking the registry for %s@%s: %w", name, version, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("asking the registry for %s@%s: %s answered %s", name, version, where, resp.Status)
	}
	var m manifest
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&m); err != nil {
		return nil, fmt.Errorf("reading the registry's manifest of %s@%s: %w", name, version, err)
	}
	if m.Name != name || m.Version == "" || (version != m.Version && isRelease(version)) {
		return nil, fmt.Errorf("the registry's manifest for %s@%s is of %s@%s", name, version, m.Name, m.Version)
	}
	return &m, nil
}

// isRelease says whether v is a release (it starts with a digit), not a
// dist-tag (npm's tags may not).
func isRelease(v string) bool { return v != "" && v[0] >= '0' && v[0] <= '9' }

func (u Unpacker) client() *http.Client {
	if u.Client != nil {
		return u.Client
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.Proxy = u.Config.proxy
	return &http.Client{Transport: t}
}
