package cloudinit

import (
	"bytes"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/agent-vm/agent-vm/modules"
)

var (
	hostnameRE   = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	instanceIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	packageRE    = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+$`)
)

// Limits of what the guest can take.
const (
	minUID        = 1000 // below: the guest's system accounts (Debian's UID_MIN)
	maxID         = 1<<32 - 2
	nobodyID      = 65534
	maxMCPConfig  = 1 << 20
	maxExtraPkgs  = 100
	minMCPPort    = 1024 // dev cannot bind below
	maxKeys       = 100
	maxKeyLineLen = 16 << 10
)

// Validate checks every field and reports all problems at once, each naming
// the field and how to fix it.
func (c Config) Validate() error {
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	add(validateInstanceID(c.InstanceID))
	add(validateHostname(c.Hostname))
	add(validateUID(c.UID))
	add(validateGID(c.GID))
	add(validateAuthorizedKeys(c.AuthorizedKeys))
	add(validateHostKey(c.HostKey))
	add(validateMCP(c.MCP))
	add(validatePackages(c.ExtraPackages))
	add(validateMAC(c.MACAddress))
	add(validateCACerts(c.CACerts))
	add(validateGuidance(c.Guidance))
	add(validateNPMPackages(c.NPMPackages))
	add(validateNPMPackages(c.NPMPrograms))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("invalid cloud-init config: %w", err)
	}
	return nil
}

func validateInstanceID(id string) error {
	if !instanceIDRE.MatchString(id) {
		return fmt.Errorf("instance id %q: want 1-128 letters, digits, '.', '-' or '_', starting with a letter or digit", id)
	}
	return nil
}

func validateHostname(h string) error {
	if !hostnameRE.MatchString(h) {
		return fmt.Errorf("hostname %q is not a DNS label (hint: 1-63 lowercase letters, digits and '-', not starting or ending with '-')", h)
	}
	return nil
}

func validateUID(uid int) error {
	switch {
	case uid == 0:
		return errors.New("uid 0 (root) cannot be the login user dev (hint: agent-vm run as root hands a root-owned workspace to its account agent-vm; elsewhere give the workspace to an account of uid 1000 or more with chown -R)")
	case uid < 0 || uid > maxID:
		return fmt.Errorf("uid %d is out of range (1000-%d)", uid, maxID)
	case uid < minUID:
		return fmt.Errorf("uid %d would clash with the guest's system accounts (below 1000) (hint: give the workspace to an account of uid 1000 or more with chown -R, or run agent-vm as that account)", uid)
	case uid == nobodyID || uid == 65535:
		return fmt.Errorf("uid %d is reserved (nobody, or -1 in 16 bits)", uid)
	}
	return nil
}

func validateGID(gid int) error {
	switch {
	case gid == 0:
		return errors.New("gid 0 (root) cannot be dev's group (hint: agent-vm run as root hands a root-owned workspace to its account agent-vm; elsewhere give the workspace to a group other than root with chown -R)")
	case gid < 0 || gid > maxID:
		return fmt.Errorf("gid %d is out of range (1-%d)", gid, maxID)
	case gid == nobodyID || gid == 65535:
		return fmt.Errorf("gid %d is reserved (nogroup, or -1 in 16 bits)", gid)
	}
	return nil
}

// knownKeyType reports whether an authorized_keys line may carry typ.
func knownKeyType(typ string) bool {
	switch typ {
	case "ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
		"ssh-rsa", "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com":
		return true
	}
	return false
}

func validateAuthorizedKeys(keys []string) error {
	if len(keys) == 0 {
		return errors.New("no authorized key for dev (hint: pass the VM's public key, the contents of ssh/id_ed25519.pub)")
	}
	if len(keys) > maxKeys {
		return fmt.Errorf("%d authorized keys are more than %d", len(keys), maxKeys)
	}
	var errs []error
	for i, k := range keys {
		if _, _, err := parsePublicKeyLine(k); err != nil {
			errs = append(errs, fmt.Errorf("authorized key %d: %w", i+1, err))
		}
	}
	return errors.Join(errs...)
}

// parsePublicKeyLine checks an OpenSSH public key line ("TYPE BASE64
// [comment]") and returns its type and wire-format blob.
func parsePublicKeyLine(line string) (string, []byte, error) {
	if strings.TrimSpace(line) == "" {
		return "", nil, errors.New("is empty (hint: pass an OpenSSH public key line such as \"ssh-ed25519 AAAA... comment\")")
	}
	if len(line) > maxKeyLineLen {
		return "", nil, fmt.Errorf("is %d bytes long, more than %d", len(line), maxKeyLineLen)
	}
	for _, r := range line {
		if r < 0x20 || r > 0x7e {
			return "", nil, fmt.Errorf("contains the character %q (hint: one line of printable ASCII)", r)
		}
	}
	fields := strings.Fields(line)
	if len(fields) < 2 {
		return "", nil, errors.New("is not \"TYPE BASE64 [comment]\"")
	}
	typ := fields[0]
	if !knownKeyType(typ) {
		return "", nil, fmt.Errorf("has unknown key type %q (options before the key are not supported)", typ)
	}
	blob, err := base64.StdEncoding.DecodeString(fields[1])
	if err != nil {
		return "", nil, fmt.Errorf("has a key that is not base64: %w", err)
	}
	inner, _, ok := readString(blob)
	if !ok || string(inner) != typ {
		return "", nil, fmt.Errorf("says %q but its key data does not", typ)
	}
	return typ, blob, nil
}

func validateHostKey(k HostKey) error {
	if k.Public == "" || k.Private == "" {
		return errors.New("host key: both the private and the public key are required (hint: generate them with ssh-keygen -t ed25519 -N '')")
	}
	typ, pub, err := parsePublicKeyLine(k.Public)
	if err != nil {
		return fmt.Errorf("host public key: %w", err)
	}
	if typ != "ssh-ed25519" {
		return fmt.Errorf("host public key is %s; the guest contract pins an ssh-ed25519 key", typ)
	}
	if err := checkPrivateKey(k.Private, pub); err != nil {
		return fmt.Errorf("host private key: %w", err)
	}
	return nil
}

// checkPrivateKey checks that private is an unencrypted OpenSSH ed25519
// private key whose public half is pubBlob (PROTOCOL.key in OpenSSH).
func checkPrivateKey(private string, pubBlob []byte) error {
	for _, r := range private {
		if (r < 0x20 || r > 0x7e) && r != '\n' && r != '\r' {
			return fmt.Errorf("contains the character %q; want the PEM text ssh-keygen writes", r)
		}
	}
	block, rest := pem.Decode([]byte(private))
	if block == nil || block.Type != "OPENSSH PRIVATE KEY" {
		return errors.New("is not an OpenSSH private key (-----BEGIN OPENSSH PRIVATE KEY-----)")
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return errors.New("has text after the key")
	}
	const magic = "openssh-key-v1\x00"
	data, ok := bytes.CutPrefix(block.Bytes, []byte(magic))
	if !ok {
		return errors.New("has an unknown format (want openssh-key-v1)")
	}
	cipher, data, ok1 := readString(data)
	kdf, data, ok2 := readString(data)
	_, data, ok3 := readString(data) // kdf options
	if !ok1 || !ok2 || !ok3 || len(data) < 4 {
		return errors.New("is truncated")
	}
	if string(cipher) != "none" || string(kdf) != "none" {
		return errors.New("is encrypted; sshd needs it without a passphrase (hint: ssh-keygen -N '')")
	}
	if n := binary.BigEndian.Uint32(data); n != 1 {
		return fmt.Errorf("holds %d keys, want 1", n)
	}
	pub, data, ok := readString(data[4:])
	if !ok {
		return errors.New("is truncated")
	}
	if !bytes.Equal(pub, pubBlob) {
		return errors.New("does not match the host public key")
	}
	priv, _, ok := readString(data)
	if !ok || len(priv) < 8 || binary.BigEndian.Uint32(priv) != binary.BigEndian.Uint32(priv[4:]) {
		return errors.New("has a damaged private section")
	}
	typ, priv, ok1 := readString(priv[8:])
	pk, priv, ok2 := readString(priv)
	sk, _, ok3 := readString(priv)
	if !ok1 || !ok2 || !ok3 || string(typ) != "ssh-ed25519" || len(pk) != ed25519.PublicKeySize || len(sk) != ed25519.PrivateKeySize {
		return errors.New("is not an ed25519 key")
	}
	derived := ed25519.NewKeyFromSeed(sk[:ed25519.SeedSize]).Public().(ed25519.PublicKey)
	if !bytes.Equal(derived, pk) || !bytes.Equal(pubBlob[len(pubBlob)-ed25519.PublicKeySize:], pk) {
		return errors.New("does not match the host public key")
	}
	return nil
}

// readString reads an SSH wire-format string (uint32 length, bytes).
func readString(b []byte) (s, rest []byte, ok bool) {
	if len(b) < 4 {
		return nil, nil, false
	}
	n := binary.BigEndian.Uint32(b)
	if uint64(n) > uint64(len(b)-4) {
		return nil, nil, false
	}
	return b[4 : 4+n], b[4+n:], true
}

func validateMCP(m MCP) error {
	var errs []error
	if m.Port != 0 && (m.Port < minMCPPort || m.Port > 65535) {
		errs = append(errs, fmt.Errorf("mcp port %d is out of range (hint: %d-65535; dev cannot bind lower ports; 0 means %d)", m.Port, minMCPPort, DefaultMCPPort))
	}
	for _, o := range m.AllowOrigins {
		if err := modules.CheckOrigin("allowed origin", o); err != nil {
			errs = append(errs, err)
		}
	}
	if m.Config != nil {
		if len(m.Config) > maxMCPConfig {
			errs = append(errs, fmt.Errorf("mcp config is %d bytes, more than %d", len(m.Config), maxMCPConfig))
		} else if !json.Valid(m.Config) || !bytes.HasPrefix(bytes.TrimSpace(m.Config), []byte("{")) {
			errs = append(errs, errors.New(`mcp config is not a JSON object (hint: Claude's {"mcpServers": {...}} shape)`))
		}
	}
	return errors.Join(errs...)
}

// CheckPackages refuses names that are not Debian package names, naming
// each bad one.
func CheckPackages(pkgs []string) error { return validatePackages(pkgs) }

func validatePackages(pkgs []string) error {
	if len(pkgs) > maxExtraPkgs {
		return fmt.Errorf("%d extra packages are more than %d", len(pkgs), maxExtraPkgs)
	}
	var errs []error
	for _, p := range pkgs {
		if !packageRE.MatchString(p) {
			errs = append(errs, fmt.Errorf("package name %q is not a Debian package name (hint: lowercase letters, digits, '+', '-' and '.', starting with a letter or digit, at least two characters, e.g. \"ripgrep\")", p))
		}
	}
	return errors.Join(errs...)
}

func validateMAC(mac string) error {
	if mac == "" {
		return nil
	}
	hw, err := net.ParseMAC(mac)
	if err != nil || len(hw) != 6 || hw.String() != mac {
		return fmt.Errorf("mac address %q: want six lowercase hex pairs joined by ':' (such as %s)", mac, DefaultMACAddress)
	}
	if hw[0]&1 != 0 {
		return fmt.Errorf("mac address %q is a multicast address", mac)
	}
	return nil
}

// validateCACerts accepts PEM blocks that each hold one certificate and
// nothing else.
func validateCACerts(pems []string) error {
	for i, p := range pems {
		b, rest := pem.Decode([]byte(p))
		if b == nil || b.Type != "CERTIFICATE" || strings.TrimSpace(string(rest)) != "" {
			return fmt.Errorf("CA certificate %d is not one PEM CERTIFICATE block", i+1)
		}
		if _, err := x509.ParseCertificate(b.Bytes); err != nil {
			return fmt.Errorf("CA certificate %d: %w", i+1, err)
		}
	}
	return nil
}

// validateGuidance keeps the guidance note a short text file.
func validateGuidance(g string) error {
	switch {
	case len(g) > 16<<10:
		return fmt.Errorf("guidance is %d bytes, more than 16 KiB", len(g))
	case !utf8.ValidString(g) || strings.ContainsRune(g, 0):
		return errors.New("guidance is not text (invalid UTF-8 or a NUL byte)")
	}
	return nil
}

// npmSpecRE is an npm package name, optionally scoped (npm's rules, and
// no leading dash, so a name is never read as an option), optionally
// @VERSION: a release or a dist-tag, never a range, URL or path.
var npmSpecRE = regexp.MustCompile(`^(@[a-z0-9~][a-z0-9._~-]*/)?[a-z0-9~][a-z0-9._~-]*(@([0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.-]+)?|[a-z][a-z0-9-]*))?$`)

func validateNPMPackages(pkgs []string) error {
	for _, p := range pkgs {
		if len(p) > 214+64 || !npmSpecRE.MatchString(p) {
			return fmt.Errorf("npm package name %q is not valid (hint: e.g. @anthropic-ai/claude-code or @anthropic-ai/claude-code@2.1.332)", p)
		}
	}
	return nil
}
