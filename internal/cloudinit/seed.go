package cloudinit

import (
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/agent-vm/agent-vm/internal/iso9660"
)

// Names of the NoCloud documents on the seed.
const (
	userDataName      = "user-data"
	metaDataName      = "meta-data"
	networkConfigName = "network-config"
)

// SeedOptions says what goes on the seed besides the rendered documents.
type SeedOptions struct {
	// AgentBinary is the host path of the agent-vm binary the guest runs
	// (a linux/amd64 executable, usually the running binary itself). The
	// guest installs it to /usr/local/bin/agent-vm at every boot. Required.
	AgentBinary string
	// ModTime is every timestamp in the ISO. Pass a fixed time (such as the
	// VM's creation time) so the same Config always gives the same bytes.
	ModTime time.Time
	// Extra files for the seed's root; their names must not be user-data,
	// meta-data, network-config, agent-vm or agent-vm.sha256.
	Extra []iso9660.File
}

// WriteSeed renders c and writes the seed ISO (volume id cidata) to path,
// atomically and with mode 0600: it holds the host's private key. The
// launcher attaches it as a read-only virtio disk at every boot.
func WriteSeed(ctx context.Context, path string, c Config, o SeedOptions) error {
	seed, err := Render(c)
	if err != nil {
		return err
	}
	if err := checkAgentBinary(o.AgentBinary); err != nil {
		return err
	}
	digest, err := fileSHA256(o.AgentBinary)
	if err != nil {
		return fmt.Errorf("agent-vm binary for the guest: %w", err)
	}
	files := []iso9660.File{
		{Name: userDataName, Data: seed.UserData, Mode: 0o600},
		{Name: metaDataName, Data: seed.MetaData, Mode: 0o644},
		{Name: networkConfigName, Data: seed.NetworkConfig, Mode: 0o644},
		{Name: AgentBinaryName, SourcePath: o.AgentBinary, Mode: 0o755},
		{Name: AgentDigestName, Data: []byte(digest + "\n"), Mode: 0o644},
	}
	for _, f := range o.Extra {
		switch f.Name {
		case userDataName, metaDataName, networkConfigName, AgentBinaryName, AgentDigestName:
			return fmt.Errorf("extra seed file %q would replace agent-vm's own", f.Name)
		}
		files = append(files, f)
	}
	err = iso9660.Write(ctx, path, iso9660.Volume{ID: SeedLabel, ModTime: o.ModTime, Files: files})
	if err != nil {
		return fmt.Errorf("writing the cloud-init seed: %w", err)
	}
	return nil
}

// fileSHA256 is the SHA-256 of the file at path, in hex.
func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// checkAgentBinary makes sure the guest gets something it can run: an
// x86-64 ELF executable (the guest is qemu-system-x86_64).
func checkAgentBinary(path string) error {
	if path == "" {
		return errors.New("no agent-vm binary for the guest (hint: pass the path of a linux/amd64 agent-vm, such as the running executable)")
	}
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("agent-vm binary for the guest %s: %w (hint: it must be a linux/amd64 executable)", path, err)
	}
	defer f.Close()
	if f.Machine != elf.EM_X86_64 || (f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN) {
		return fmt.Errorf("agent-vm binary for the guest %s is a %s %s, not an x86-64 executable (hint: build it with GOOS=linux GOARCH=amd64)", path, f.Machine, f.Type)
	}
	return nil
}
