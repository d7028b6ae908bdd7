package egress

import (
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/agent-vm/agent-vm/internal/credswap"
)

// Bundle is what agent-vm hands a VM's proxy on its standard input as it
// starts it (`net-proxy --secrets-stdin`): the VM's CA and the secrets in
// the VM's scope, with their values. It travels through a pipe only:
// never a file, an argument or an environment variable, which other
// processes or a later reader of the disk could see. The proxy reads it
// before it drops its privileges, and keeps it in memory alone.
type Bundle struct {
	CACert string `json:"ca_cert"` // PEM
	CAKey  string `json:"ca_key"`  // PEM
	// Branch is the one branch a push through an intercepted host may
	// update, Repo the path of the one repository it may update there
	// ("" is any): see Interceptor.
	Branch  string            `json:"branch"`
	Repo    string            `json:"repo,omitempty"`
	Secrets []credswap.Secret `json:"secrets"`
}

// maxBundle bounds what the proxy reads from its standard input: a CA
// and some secrets of at most 64 KiB each.
const maxBundle = 8 << 20

// TestRootCAEnv names a PEM file of CA certificates the proxy trusts, as
// well as the host's, when it verifies an intercepted host: how tests put
// a server of their own behind a bound name. Not for users.
const TestRootCAEnv = "AGENT_VM_TEST_EGRESS_ROOT_CA"

// ReadBundle reads a Bundle from r and makes the Interceptor it describes.
// Its errors name no value.
func ReadBundle(r io.Reader, testRootCA string) (*Interceptor, error) {
	raw, err := io.ReadAll(io.LimitReader(r, maxBundle+1))
	if err != nil {
		return nil, fmt.Errorf("reading the secrets from standard input: %w", err)
	}
	if len(raw) > maxBundle {
		return nil, fmt.Errorf("the secrets on standard input are over %d MiB", maxBundle>>20)
	}
	var b Bundle
	if err := json.Unmarshal(raw, &b); err != nil {
		return nil, errors.New("the secrets on standard input are not a bundle agent-vm wrote") // the JSON error could quote a value
	}
	ca, err := LoadCA([]byte(b.CACert), []byte(b.CAKey))
	if err != nil {
		return nil, err
	}
	set, err := credswap.New(b.Secrets)
	if err != nil {
		return nil, err
	}
	ic := NewInterceptor(ca, set, b.Branch, b.Repo)
	if testRootCA != "" {
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		pem, err := os.ReadFile(testRootCA)
		if err != nil || !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s=%s: no PEM certificates to read", TestRootCAEnv, testRootCA)
		}
		ic.RootCAs = pool
	}
	return ic, nil
}
