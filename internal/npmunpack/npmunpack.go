// Package npmunpack installs npm packages that need nothing run at install
// as npm lays them out in a global install, without npm: it reads each
// package's manifest from the registry, downloads its tarball, checks it
// against the manifest's integrity hash and unpacks it. npm, a Node.js
// program, is slow where the CPU is emulated (a guest under TCG): it took
// 66 s of a guest's time to unpack a 51 MB tarball that curl, sha512sum
// and tar fetched, checked and unpacked in 12 s. Claude Code's program
// package and the DevTools MCP server with its Node.js are such packages.
//
// We define the following terms:
//   - a spec: NAME@VERSION, VERSION a release or a dist-tag, as npm
//     install takes it;
//   - a manifest: the registry's document of one version of a package
//     (its package.json, and dist: the tarball's URL and integrity);
//   - plain: a package whose manifest asks npm for nothing but unpacking
//     it and linking its programs: no dependencies (bundled ones come in
//     its tarball; optional peers are not installed), no install scripts,
//     no native build, no man pages or bin directory, and an os, cpu and
//     libc this machine has;
//   - the global layout: PREFIX/lib/node_modules/NAME holds the package
//     (its tarball's files less the first path element, with npm's
//     modes), PREFIX/bin/BIN is a relative symlink to each of its
//     programs.
//
// Install unpacks a list of specs only if npm's configuration is one this
// package reads and every spec is plain; otherwise it returns an error
// that wraps ErrNeedsNPM, having changed nothing, and the caller runs npm.
package npmunpack

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
)

// ErrNeedsNPM is wrapped by the errors that mean npm itself must install
// the specs: its configuration, or a package, asks for more than this
// package does.
var ErrNeedsNPM = errors.New("npm must install them")

// needsNPM is an error wrapping ErrNeedsNPM that says why.
func needsNPM(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrNeedsNPM}, args...)...)
}

// Unpacker installs plain packages under a prefix.
type Unpacker struct {
	// Prefix is npm's global prefix: the packages go in
	// Prefix/lib/node_modules, their programs' links in Prefix/bin ("":
	// npm's default, which npm knows).
	Prefix string
	// Config is npm's configuration (ReadConfig).
	Config Config
	// Client fetches manifests and tarballs (nil: one that honours
	// Config's proxies).
	Client *http.Client
	// OS, CPU and Libc are this machine's, in npm's words (linux; x64,
	// arm64; glibc, musl).
	OS, CPU, Libc string
}

// Installed is one package unpacked.
type Installed struct {
	Name, Version string
	Dir           string   // its directory
	Bins          []string // its programs' links
}

// Install installs specs (all plain, else nothing) and says what it
// installed, in order. A package already there at another version is
// replaced whole, as npm does.
func (u Unpacker) Install(ctx context.Context, specs []string) ([]Installed, error) {
	if len(specs) == 0 {
		return nil, nil
	}
	if err := u.Config.plain(); err != nil {
		return nil, err
	}
	if u.Prefix == "" {
		return nil, needsNPM("npm's configuration names no global prefix")
	}
	ms := make([]*manifest, len(specs))
	for i, spec := range specs {
		name, version, err := ParseSpec(spec)
		if err != nil {
			return nil, err
		}
		m, err := u.manifest(ctx, name, version)
		if err != nil {
			return nil, err
		}
		if err := m.plain(u.OS, u.CPU, u.Libc); err != nil {
			return nil, fmt.Errorf("%s: %w", spec, err)
		}
		ms[i] = m
	}
	var done []Installed
	for _, m := range ms {
		in, err := u.unpack(ctx, m)
		if err != nil {
			return done, fmt.Errorf("installing %s@%s: %w", m.Name, m.Version, err)
		}
		done = append(done, in)
	}
	// npm's record of the global tree, if it keeps one, no longer tells
	// the tree: without it npm reads the packages' own package.json.
	_ = os.Remove(filepath.Join(u.root(), ".package-lock.json"))
	return done, nil
}

func (u Unpacker) root() string { return filepath.Join(u.Prefix, "lib", "node_modules") }

// ParseSpec splits NAME@VERSION (a scoped NAME is @scope/name); VERSION
// is a release or a dist-tag, never a range, a URL or a path: those are
// npm's to resolve.
func ParseSpec(spec string) (name, version string, err error) {
	i := strings.LastIndex(spec, "@")
	if i <= 0 {
		return "", "", needsNPM("%q names no version", spec)
	}
	name, version = spec[:i], spec[i+1:]
	if !validName(name) || !validVersion(version) {
		return "", "", needsNPM("%q is not NAME@VERSION with a release or a dist-tag", spec)
	}
	return name, version, nil
}

// validName is an npm package name: lowercase, at most one scope, no path
// tricks (npm's rules for new packages, which the registry enforces).
func validName(name string) bool {
	scope, rest, scoped := strings.Cut(name, "/")
	if scoped {
		if !strings.HasPrefix(scope, "@") || !validPart(scope[1:]) {
			return false
		}
		name = rest
	}
	return len(name) <= 214 && validPart(name)
}

func validPart(s string) bool {
	if s == "" || s[0] == '.' || s[0] == '_' {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || strings.ContainsRune("-._~", r)) {
			return false
		}
	}
	return true
}

// validVersion is a release (1.2.3, 1.2.3-beta.1+build) or a dist-tag
// (npm's tags start with a letter, and are not a version with a v).
func validVersion(v string) bool {
	return releaseRE.MatchString(v) || tagRE.MatchString(v) && !vReleaseRE.MatchString(v)
}

var (
	releaseRE  = regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$`)
	tagRE      = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9._-]{0,63}$`)
	vReleaseRE = regexp.MustCompile(`^[vV][0-9]`)
)

// ThisMachine is this machine's os, cpu and libc in npm's words (Node.js's
// process.platform and process.arch; glibc unless musl's loader is there).
func ThisMachine() (os, cpu, libc string) {
	cpu = map[string]string{"amd64": "x64", "386": "ia32"}[runtime.GOARCH]
	if cpu == "" {
		cpu = runtime.GOARCH
	}
	libc = "glibc"
	if m, _ := filepath.Glob("/lib/ld-musl-*"); len(m) > 0 {
		libc = "musl"
	}
	return runtime.GOOS, cpu, libc
}
