package npmunpack

import (
	"archive/tar"
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"crypto/sha512"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/guest"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// These tests unpack tarballs made here, served by a stand-in registry
// (labelled: an httptest server that answers manifests and tarballs as
// registry.npmjs.org does, from the test's own data); TestSameTreeAsNPM
// compares the result with npm's own install from the real registry.

// entry is a file of a test tarball.
type entry struct {
	name string
	mode int64
	typ  byte
	body string
	link string
}

func tarball(t *testing.T, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, e := range entries {
		typ := e.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		h := &tar.Header{Name: e.name, Mode: e.mode, Typeflag: typ, Linkname: e.link}
		if typ == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if typ == tar.TypeReg {
			tw.Write([]byte(e.body))
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	gz.Close()
	return buf.Bytes()
}

func integrity(b []byte) string {
	sum := sha512.Sum512(b)
	return "sha512-" + base64.StdEncoding.EncodeToString(sum[:])
}

// registry is the stand-in registry: manifests by "name/version" (the
// registry's path, a scoped name's slash escaped), tarballs by path.
type registry struct {
	*httptest.Server
	manifests map[string]map[string]any
	tarballs  map[string][]byte
	asked     []string
}

func newRegistry(t *testing.T) *registry {
	r := &registry{manifests: map[string]map[string]any{}, tarballs: map[string][]byte{}}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.asked = append(r.asked, req.URL.EscapedPath())
		if b, ok := r.tarballs[req.URL.Path]; ok {
			w.Write(b)
			return
		}
		p := strings.TrimPrefix(req.URL.EscapedPath(), "/")
		if m, ok := r.manifests[p]; ok {
			json.NewEncoder(w).Encode(m)
			return
		}
		http.NotFound(w, req)
	}))
	t.Cleanup(r.Close)
	return r
}

// publish serves a package's manifest (fields over name, version and
// dist) and tarball.
func (r *registry) publish(name, version string, tgz []byte, fields map[string]any) {
	file := "/tarballs/" + strings.ReplaceAll(name, "/", "-") + "-" + version + ".tgz"
	r.tarballs[file] = tgz
	m := map[string]any{"name": name, "version": version, "dist": map[string]any{"tarball": r.URL + file, "integrity": integrity(tgz)}}
	for k, v := range fields {
		m[k] = v
	}
	r.manifests[strings.Replace(name, "/", "%2f", 1)+"/"+version] = m
}

func (r *registry) unpacker(prefix string) Unpacker {
	return Unpacker{Prefix: prefix, Config: Config{Registry: r.URL + "/"}, OS: "linux", CPU: "x64", Libc: "glibc"}
}

// tree is every path under dir with its mode and its content or link.
func tree(t *testing.T, dir string) map[string]string {
	t.Helper()
	got := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			got[rel] = "-> " + l
		case fi.IsDir():
			got[rel] = fi.Mode().String()
		default:
			b, _ := os.ReadFile(p)
			if len(b) > 256 {
				sum := sha512.Sum512(b)
				b = []byte(base64.StdEncoding.EncodeToString(sum[:8]))
			}
			got[rel] = fi.Mode().String() + " " + string(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func TestInstallUnpacksAsNPMDoes(t *testing.T) {
	r := newRegistry(t)
	pj := `{"name":"@scope/tool","version":"1.0.0","bin":{"tool":"bin/tool.js","tool-b":"./lib/b.js"}}`
	r.publish("@scope/tool", "1.0.0", tarball(t,
		entry{name: "package/", mode: 0o700, typ: tar.TypeDir},
		entry{name: "package/package.json", mode: 0o644, body: pj},
		entry{name: "package/bin/tool.js", mode: 0o644, body: "#!/usr/bin/env node\n"},
		entry{name: "package/lib/b.js", mode: 0o600, body: "b"},
		entry{name: "package/lib/run.sh", mode: 0o700, body: "#!/bin/sh\n"},
		entry{name: "package/lib/any.sh", mode: 0o775, body: "#!/bin/sh\n"},
		entry{name: "package/lib/link", typ: tar.TypeSymlink, link: "/etc/passwd"},
		entry{name: "package/lib/hard", typ: tar.TypeLink, link: "package/lib/b.js"},
	), map[string]any{"bin": map[string]string{"tool": "bin/tool.js", "tool-b": "./lib/b.js"}, "scripts": map[string]string{"prepare": "tsc", "test": "x"}})
	prefix := t.TempDir()
	done, err := r.unpacker(prefix).Install(context.Background(), []string{"@scope/tool@1.0.0"})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(prefix, "lib", "node_modules", "@scope", "tool")
	slices.Sort(done[0].Bins)
	if len(done) != 1 || done[0].Dir != dir || done[0].Version != "1.0.0" || !slices.Equal(done[0].Bins, []string{filepath.Join(prefix, "bin", "tool"), filepath.Join(prefix, "bin", "tool-b")}) {
		t.Errorf("installed %+v", done)
	}
	// npm's modes: files 0644, or 0755/0744 with the tarball's executable
	// bits, programs executable; directories 0755; no links unpacked.
	want := map[string]string{
		"bin":                              "drwxr-xr-x",
		"bin/tool":                         "-> ../lib/node_modules/@scope/tool/bin/tool.js",
		"bin/tool-b":                       "-> ../lib/node_modules/@scope/tool/lib/b.js",
		"lib":                              "drwxr-xr-x",
		"lib/node_modules":                 "drwxr-xr-x",
		"lib/node_modules/@scope":          "drwxr-xr-x",
		"lib/node_modules/@scope/tool":     "drwxr-xr-x",
		"lib/node_modules/@scope/tool/bin": "drwxr-xr-x",
		"lib/node_modules/@scope/tool/lib": "drwxr-xr-x",
		"lib/node_modules/@scope/tool/bin/tool.js":  "-rwxr-xr-x #!/usr/bin/env node\n",
		"lib/node_modules/@scope/tool/lib/b.js":     "-rwxr-xr-x b",
		"lib/node_modules/@scope/tool/lib/run.sh":   "-rwxr--r-- #!/bin/sh\n",
		"lib/node_modules/@scope/tool/lib/any.sh":   "-rwxr-xr-x #!/bin/sh\n",
		"lib/node_modules/@scope/tool/package.json": "-rw-r--r-- " + pj,
	}
	if got := tree(t, prefix); !mapsEqual(got, want) {
		t.Errorf("the prefix holds\n%s\nwant\n%s", show(got), show(want))
	}
	if !slices.Contains(r.asked, "/@scope%2ftool/1.0.0") {
		t.Errorf("the registry was asked %v, want the scoped name's manifest at /@scope%%2ftool/1.0.0", r.asked)
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func show(m map[string]string) string {
	var lines []string
	for k, v := range m {
		lines = append(lines, k+"  "+v)
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// A new version replaces the old one whole, and the links of programs it
// no longer has go; a dist-tag is asked for as such.
func TestInstallReplacesTheVersionThere(t *testing.T) {
	r := newRegistry(t)
	r.publish("tool", "1.0.0", tarball(t, entry{name: "package/package.json", mode: 0o644, body: `{"name":"tool","bin":{"tool":"a.js","old":"old.js"}}`},
		entry{name: "package/a.js", mode: 0o644, body: "1"}, entry{name: "package/old.js", mode: 0o644, body: "old"}),
		map[string]any{"bin": map[string]string{"tool": "a.js", "old": "old.js"}})
	r.publish("tool", "2.0.0", tarball(t, entry{name: "package/package.json", mode: 0o644, body: `{"name":"tool","bin":"a.js"}`},
		entry{name: "package/a.js", mode: 0o644, body: "2"}), map[string]any{"bin": "a.js"})
	r.manifests["tool/latest"] = r.manifests["tool/2.0.0"]
	prefix := t.TempDir()
	u := r.unpacker(prefix)
	if _, err := u.Install(context.Background(), []string{"tool@1.0.0"}); err != nil {
		t.Fatal(err)
	}
	// Another program's file where a link of the old version was is not
	// touched.
	if _, err := u.Install(context.Background(), []string{"tool@latest"}); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"bin": "drwxr-xr-x", "bin/tool": "-> ../lib/node_modules/tool/a.js",
		"lib": "drwxr-xr-x", "lib/node_modules": "drwxr-xr-x", "lib/node_modules/tool": "drwxr-xr-x",
		"lib/node_modules/tool/a.js":         "-rwxr-xr-x 2",
		"lib/node_modules/tool/package.json": `-rw-r--r-- {"name":"tool","bin":"a.js"}`,
	}
	if got := tree(t, prefix); !mapsEqual(got, want) {
		t.Errorf("after the second install the prefix holds\n%s\nwant\n%s", show(got), show(want))
	}
}

// What npm would do more than unpack makes the install npm's, and nothing
// is made, for the plain packages of the list either.
func TestInstallLeavesToNPMWhatNeedsIt(t *testing.T) {
	for _, c := range []struct {
		what   string
		fields map[string]any
		want   string
	}{
		{"dependencies", map[string]any{"dependencies": map[string]string{"x": "^1"}}, "dependencies"},
		{"optional dependencies", map[string]any{"optionalDependencies": map[string]string{"x-linux": "1.0.0"}}, "dependencies"},
		{"a postinstall script", map[string]any{"scripts": map[string]string{"postinstall": "node install.js"}}, "install scripts"},
		{"a native build", map[string]any{"gypfile": true}, "native code"},
		{"man pages", map[string]any{"man": []string{"./man/x.1"}}, "man pages"},
		{"a bin directory", map[string]any{"directories": map[string]string{"bin": "./bin"}}, "bin directory"},
		{"another os", map[string]any{"os": []string{"darwin"}}, "not linux"},
		{"another cpu", map[string]any{"cpu": "arm64"}, "not linux x64"},
		{"this cpu refused", map[string]any{"cpu": []string{"!x64"}}, "not linux x64"},
		{"musl", map[string]any{"libc": []string{"musl"}}, "glibc"},
		{"a peer dependency", map[string]any{"peerDependencies": map[string]string{"react": "*"}}, "peer dependencies"},
		{"a program outside the package", map[string]any{"bin": map[string]string{"x": "../../x"}}, "not a plain name"},
		{"a program named as a path", map[string]any{"bin": map[string]string{"../x": "a.js"}}, "not a plain name"},
		{"no sha512", map[string]any{"dist": map[string]any{"tarball": "http://x/t.tgz", "shasum": "abc"}}, "sha512"},
	} {
		r := newRegistry(t)
		tgz := tarball(t, entry{name: "package/package.json", mode: 0o644, body: "{}"})
		r.publish("plain", "1.0.0", tgz, nil)
		r.publish("other", "1.0.0", tgz, c.fields)
		prefix := t.TempDir()
		_, err := r.unpacker(prefix).Install(context.Background(), []string{"plain@1.0.0", "other@1.0.0"})
		if !errors.Is(err, ErrNeedsNPM) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "other@1.0.0") {
			t.Errorf("%s: %v, want it npm's, saying %q", c.what, err, c.want)
		}
		if got := tree(t, prefix); len(got) > 0 {
			t.Errorf("%s: made %v", c.what, got)
		}
	}
	// Optional peers are not installed by npm, nor scripts other than the
	// install ones run: such a package is plain.
	r := newRegistry(t)
	r.publish("mcp", "1.0.0", tarball(t, entry{name: "package/package.json", mode: 0o644, body: "{}"}), map[string]any{
		"peerDependencies": map[string]string{"x": "^2"}, "peerDependenciesMeta": map[string]any{"x": map[string]bool{"optional": true}},
		"scripts": map[string]string{"prepare": "node scripts/prepare.ts", "build": "tsc"}, "os": "linux", "cpu": []string{"x64", "arm64"}, "libc": []string{"glibc"}})
	if _, err := r.unpacker(t.TempDir()).Install(context.Background(), []string{"mcp@1.0.0"}); err != nil {
		t.Errorf("a package with optional peers and a prepare script: %v, want it unpacked", err)
	}
	for _, spec := range []string{"tool", "tool@^1.0.0", "tool@1.x", "tool@1", "tool@v1.2.3", "tool@git+https://x", "tool@file:../x", "Tool@1.0.0", "../x@1.0.0", "@scope@1.0.0", "tool@"} {
		if _, err := r.unpacker(t.TempDir()).Install(context.Background(), []string{spec}); !errors.Is(err, ErrNeedsNPM) {
			t.Errorf("spec %q: %v, want it npm's", spec, err)
		}
	}
}

// A download that does not match its integrity, a tarball with an entry
// outside the package, a version the registry does not have: an error,
// and the version installed before is there as it was.
func TestInstallFailuresKeepWhatWasThere(t *testing.T) {
	r := newRegistry(t)
	r.publish("tool", "1.0.0", tarball(t, entry{name: "package/package.json", mode: 0o644, body: `{"name":"tool","bin":"a.js"}`},
		entry{name: "package/a.js", mode: 0o644, body: "1"}), map[string]any{"bin": "a.js"})
	prefix := t.TempDir()
	u := r.unpacker(prefix)
	if _, err := u.Install(context.Background(), []string{"tool@1.0.0"}); err != nil {
		t.Fatal(err)
	}
	before := tree(t, prefix)

	r.publish("tool", "2.0.0", tarball(t, entry{name: "package/a.js", mode: 0o644, body: "2"}), map[string]any{"bin": "a.js"})
	r.tarballs["/tarballs/tool-2.0.0.tgz"] = tarball(t, entry{name: "package/a.js", mode: 0o644, body: "altered"})
	r.publish("tool", "3.0.0", tarball(t, entry{name: "package/a.js", mode: 0o644, body: "3"}, entry{name: "package/../../../escaped", mode: 0o644, body: "x"}), nil)
	r.manifests["tool/4.0.0"] = map[string]any{"name": "other", "version": "4.0.0"}
	for _, c := range []struct{ spec, want string }{
		{"tool@2.0.0", "does not name"},
		{"tool@3.0.0", "outside the package"},
		{"tool@5.0.0", "404 Not Found"},
		{"tool@4.0.0", "is of other@4.0.0"},
	} {
		_, err := u.Install(context.Background(), []string{c.spec})
		if err == nil || errors.Is(err, ErrNeedsNPM) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.spec, err, c.want)
		}
		if got := tree(t, prefix); !mapsEqual(got, before) {
			t.Errorf("%s: the prefix holds\n%s\nwant it as before\n%s", c.spec, show(got), show(before))
		}
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(prefix), "escaped")); err == nil {
		t.Error("an entry outside the package was written")
	}
	// A program's link where another program's file is: refused.
	os.Remove(filepath.Join(prefix, "bin", "tool"))
	os.WriteFile(filepath.Join(prefix, "bin", "tool"), []byte("mine"), 0o755)
	if _, err := u.Install(context.Background(), []string{"tool@1.0.0"}); err == nil || !strings.Contains(err.Error(), "is not a link") {
		t.Errorf("a file of its own at the program's link: %v, want a refusal", err)
	}
	if b, _ := os.ReadFile(filepath.Join(prefix, "bin", "tool")); string(b) != "mine" {
		t.Errorf("the file at the program's link reads %q", b)
	}
}

func TestReadConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(rel, s string) string {
		p := filepath.Join(dir, rel)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// npm's own file beside it (Debian's: /usr/share/nodejs/npm/npmrc),
	// npm on PATH a link to its bin/npm-cli.js.
	cli := write("share/npm/bin/npm-cli.js", "")
	write("share/npm/npmrc", "globalconfig="+dir+"/etc/npmrc\nprefix=/usr/local\n")
	os.MkdirAll(filepath.Join(dir, "bin"), 0o755)
	os.Symlink(cli, filepath.Join(dir, "bin", "npm"))
	write("etc/npmrc", "; agent-vm's\nproxy=http://10.0.2.100:3128\nhttps-proxy = \"http://10.0.2.100:3128\"\nnoproxy=localhost,10.0.2.100\nregistry=https://mirror.example/npm\n")
	write("home/.npmrc", "fund=false\nregistry=${MIRROR}\n")
	env := []string{"HOME=" + dir + "/home", "MIRROR=https://user-mirror.example/", "https_proxy=http://env-proxy:1"}
	c, err := ReadConfig(env, filepath.Join(dir, "bin", "npm"))
	if err != nil {
		t.Fatal(err)
	}
	want := Config{Registry: "https://user-mirror.example/", Prefix: "/usr/local", HTTPSProxy: "http://10.0.2.100:3128", HTTPProxy: "http://10.0.2.100:3128", NoProxy: "localhost,10.0.2.100"}
	if c.Registry != want.Registry || c.Prefix != want.Prefix || c.HTTPSProxy != want.HTTPSProxy || c.HTTPProxy != want.HTTPProxy || c.NoProxy != want.NoProxy || c.plain() != nil {
		t.Errorf("config %+v (%v), want %+v", c, c.plain(), want)
	}
	// The environment's npm_config_ over the files.
	c, _ = ReadConfig(append(env, "npm_config_registry=https://env.example"), filepath.Join(dir, "bin", "npm"))
	if c.Registry != "https://env.example/" {
		t.Errorf("npm_config_registry: registry %q", c.Registry)
	}
	// Without files, npm's defaults and the environment's proxies.
	c, _ = ReadConfig([]string{"HOME=/nonexistent", "npm_config_globalconfig=/nonexistent", "HTTPS_PROXY=http://p:3128", "no_proxy=.internal"}, "")
	if c.Registry != DefaultRegistry || c.Prefix != "" || c.HTTPSProxy != "http://p:3128" || c.NoProxy != ".internal" || c.plain() != nil {
		t.Errorf("no files: %+v", c)
	}
	// What this package does not read makes the configuration npm's.
	for _, line := range []string{
		"//registry.npmjs.org/:_authToken=${TOKEN}", "@scope:registry=https://x/", "cafile=/etc/ca.pem", "strict-ssl=false",
		"umask=077", "engine-strict=true", "registry=${UNSET}", "[section]", "ca[]=x", "registry=ftp://x/",
	} {
		write("home/.npmrc", line+"\n")
		c, err := ReadConfig(append(env, "TOKEN=t"), filepath.Join(dir, "bin", "npm"))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.plain(); !errors.Is(err, ErrNeedsNPM) {
			t.Errorf("%q: %v, want the configuration npm's", line, err)
		}
	}
}

func TestProxy(t *testing.T) {
	c := Config{HTTPSProxy: "10.0.2.100:3128", HTTPProxy: "http://h:1", NoProxy: "localhost, .internal,*.corp"}
	for url, want := range map[string]string{
		"https://registry.npmjs.org/x": "http://10.0.2.100:3128",
		"http://registry.npmjs.org/x":  "http://h:1",
		"https://localhost/x":          "",
		"https://npm.internal/x":       "",
		"https://a.b.corp/x":           "",
		"https://corpx/x":              "http://10.0.2.100:3128",
	} {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		p, err := c.proxy(req)
		got := ""
		if p != nil {
			got = p.String()
		}
		if err != nil || got != want {
			t.Errorf("%s: proxy %q (%v), want %q", url, got, err, want)
		}
	}
}

// TestSameTreeAsNPM installs the DevTools MCP server and its Node.js (the
// packages a template with Claude Code gets) from the real registry,
// with this package and with npm: the two prefixes hold the same files,
// modes and links.
func TestSameTreeAsNPM(t *testing.T) {
	if testing.Short() {
		t.Skip("downloads about 55 MB from the npm registry, twice; not with -short")
	}
	npm := tu.Program(t, "npm")
	d, err := guest.NewDevToolsMCP(guest.DevToolsMCPPrefix, runtime.GOARCH)
	tu.Need(t, err == nil, "the DevTools MCP server's Node.js is for amd64 and arm64 machines")
	specs := d.Packages()
	ctx := tu.Context(t, "installing from the npm registry")
	goos, cpu, libc := ThisMachine()
	ours, theirs := t.TempDir(), t.TempDir()
	u := Unpacker{Prefix: ours, OS: goos, CPU: cpu, Libc: libc, Config: Config{Registry: DefaultRegistry,
		HTTPSProxy: cmp.Or(os.Getenv("HTTPS_PROXY"), os.Getenv("https_proxy")), NoProxy: cmp.Or(os.Getenv("NO_PROXY"), os.Getenv("no_proxy"))}}
	if _, err := u.Install(ctx, specs); err != nil {
		t.Fatalf("installing %v: %v", specs, err)
	}
	argv := guest.NPMCommand(theirs, specs...)
	cmd := exec.CommandContext(ctx, npm, append([]string{"--cache", t.TempDir()}, argv[1:]...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm %v: %v\n%s", argv[1:], err, out)
	}
	got, want := tree(t, ours), tree(t, theirs)
	delete(want, filepath.Join("lib", "node_modules", ".package-lock.json"))
	if len(got) < 100 {
		t.Errorf("our install holds %d paths: %v", len(got), got)
	}
	for p, w := range want {
		if got[p] != w {
			t.Errorf("%s: ours %q, npm's %q", p, got[p], w)
		}
	}
	for p, g := range got {
		if _, ok := want[p]; !ok {
			t.Errorf("%s: ours %q, npm made none", p, g)
		}
	}
}
