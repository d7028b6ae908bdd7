package npmunpack

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// DefaultRegistry is npm's registry when its configuration names none.
const DefaultRegistry = "https://registry.npmjs.org/"

// Config is what npm's configuration says of where packages come from
// and where a global install puts them.
type Config struct {
	// Registry is the registry's URL, ending in a slash.
	Registry string
	// Prefix is the global prefix ("" when the configuration names none).
	Prefix string
	// HTTPSProxy, HTTPProxy and NoProxy are npm's proxies, the
	// environment's where its files name none.
	HTTPSProxy, HTTPProxy, NoProxy string
	// other are the keys set that this package does not read, where it
	// read them: npm's to honour (a scoped registry, credentials, a CA).
	other []string
}

// known are npm's configuration keys that change nothing of an install
// this package makes, or that it reads (checked further in set).
var known = []string{
	"registry", "prefix", "proxy", "https-proxy", "noproxy", "globalconfig", "userconfig", "globalignorefile",
	"cache", "fund", "audit", "update-notifier", "loglevel", "progress", "color", "unicode", "umask",
	"prefer-online", "prefer-offline", "fetch-retries", "fetch-retry-factor", "fetch-retry-mintimeout",
	"fetch-retry-maxtimeout", "fetch-timeout", "strict-ssl", "engine-strict", "global", "yes", "user-agent",
}

// ReadConfig reads npm's configuration as npm does for a global install,
// each layer over the one before: its built-in file (npmrc beside the
// npm at npmPath; "" for none), the global file (the globalconfig key,
// else PREFIX/etc/npmrc), the user's ($HOME/.npmrc or the userconfig
// key), then npm_config_* variables of env. A file that is not there is
// no layer; one that cannot be read is an error.
func ReadConfig(env []string, npmPath string) (Config, error) {
	vars := map[string]string{}
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			vars[k] = v
		}
	}
	values := map[string]string{}
	var sources []string
	apply := func(file string) error {
		got, err := readFile(file, vars)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		for k, v := range got {
			values[k] = v
		}
		sources = append(sources, file)
		return nil
	}
	envValues := map[string]string{}
	for k, v := range vars {
		if len(k) > len("npm_config_") && strings.EqualFold(k[:len("npm_config_")], "npm_config_") {
			envValues[strings.ReplaceAll(strings.ToLower(k[len("npm_config_"):]), "_", "-")] = v
		}
	}
	if npmPath != "" {
		if real, err := filepath.EvalSymlinks(npmPath); err == nil {
			// npm's bin/npm-cli.js: its package is two levels up.
			if err := apply(filepath.Join(filepath.Dir(filepath.Dir(real)), "npmrc")); err != nil {
				return Config{}, err
			}
		}
	}
	global := first(envValues["globalconfig"], values["globalconfig"])
	if global == "" {
		global = filepath.Join(first(envValues["prefix"], values["prefix"], "/usr/local"), "etc", "npmrc")
	}
	if err := apply(global); err != nil {
		return Config{}, err
	}
	user := first(envValues["userconfig"], values["userconfig"])
	if user == "" && vars["HOME"] != "" {
		user = filepath.Join(vars["HOME"], ".npmrc")
	}
	if user != "" {
		if err := apply(user); err != nil {
			return Config{}, err
		}
	}
	for k, v := range envValues {
		values[k] = v
	}
	c := Config{
		Registry:   first(values["registry"], DefaultRegistry),
		Prefix:     values["prefix"],
		HTTPSProxy: first(values["https-proxy"], vars["HTTPS_PROXY"], vars["https_proxy"], values["proxy"], vars["HTTP_PROXY"], vars["http_proxy"]),
		HTTPProxy:  first(values["proxy"], vars["HTTP_PROXY"], vars["http_proxy"]),
		NoProxy:    first(values["noproxy"], vars["NO_PROXY"], vars["no_proxy"]),
	}
	if !strings.HasSuffix(c.Registry, "/") {
		c.Registry += "/"
	}
	for k, v := range values {
		switch {
		case !slices.Contains(known, k),
			k == "strict-ssl" && v != "true",
			k == "engine-strict" && v != "false",
			k == "umask" && v != "0" && v != "0o0" && v != "000":
			c.other = append(c.other, k)
		}
	}
	slices.Sort(c.other)
	return c, nil
}

// plain says whether c is a configuration this package installs under.
func (c Config) plain() error {
	if len(c.other) > 0 {
		return needsNPM("npm's configuration sets %s", strings.Join(c.other, ", "))
	}
	u, err := url.Parse(c.Registry)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil {
		return needsNPM("npm's registry %q is not a plain http(s) URL", c.Registry)
	}
	return nil
}

// first is the first of values that is not "".
func first(values ...string) string {
	for _, v := range values {
		if v != "" {
			return v
		}
	}
	return ""
}

// envRef is a variable in an npmrc value: ${NAME}, or ${NAME?} (empty
// when unset).
var envRef = regexp.MustCompile(`\$\{[A-Za-z_][A-Za-z0-9_]*\??\}`)

// readFile reads an npmrc file: key = value lines, comments after ; or
// #, values quoted or not, ${VAR} replaced from vars. A line this package
// cannot read as npm would (a section, an array, an unset variable) is
// kept as a key of its own, which makes the configuration npm's.
func readFile(path string, vars map[string]string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	values := map[string]string{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == ';' || line[0] == '#' {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || strings.HasPrefix(k, "[") || strings.HasSuffix(k, "[]") {
			values[fmt.Sprintf("%s:%d", path, n)] = line
			continue
		}
		if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') && v[len(v)-1] == v[0] {
			v = v[1 : len(v)-1]
		}
		unset := false
		v = envRef.ReplaceAllStringFunc(v, func(ref string) string {
			name, optional := strings.CutSuffix(ref[2:len(ref)-1], "?")
			val, ok := vars[name]
			unset = unset || !ok && !optional
			return val
		})
		if unset {
			values[fmt.Sprintf("%s:%d", path, n)] = line
			continue
		}
		values[k] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading npm's configuration %s: %w", path, err)
	}
	return values, nil
}

// proxy is c's proxy for a request, as npm chooses it: none for a host
// NoProxy names, else HTTPSProxy for https and HTTPProxy for http.
func (c Config) proxy(req *http.Request) (*url.URL, error) {
	host := req.URL.Hostname()
	for _, e := range strings.FieldsFunc(c.NoProxy, func(r rune) bool { return r == ',' || r == ' ' }) {
		e = strings.TrimPrefix(strings.TrimPrefix(e, "*"), ".")
		if e != "" && (host == e || strings.HasSuffix(host, "."+e)) {
			return nil, nil
		}
	}
	p := c.HTTPProxy
	if req.URL.Scheme == "https" {
		p = c.HTTPSProxy
	}
	if p == "" {
		return nil, nil
	}
	if !strings.Contains(p, "://") {
		p = "http://" + p
	}
	return url.Parse(p)
}
