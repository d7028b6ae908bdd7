package harness

import "os"

// Keyboard is agent-vm's stdin: what the test types, when it types it. It
// is an OS pipe, so agent-vm gets it as its stdin directly (with any other
// reader, waiting for agent-vm would also wait for the next key), and it
// stays open until closed (an end of input would end the SSH session).
type Keyboard struct {
	*os.File // the read end, agent-vm's stdin
	w        *os.File
}

// NewKeyboard opens a keyboard; the caller closes it.
func NewKeyboard() (*Keyboard, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	return &Keyboard{File: r, w: w}, nil
}

// Type sends keys (a pipe holds far more than a test types).
func (k *Keyboard) Type(keys string) { k.w.Write([]byte(keys)) }

// Close closes both ends.
func (k *Keyboard) Close() {
	k.w.Close()
	k.File.Close()
}
