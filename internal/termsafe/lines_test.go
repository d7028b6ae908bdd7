package termsafe

import (
	"bytes"
	"strconv"
	"testing"
)

func TestLineWriter(t *testing.T) {
	progress := "==> box: Uploading base box image as volume into Libvirt storage...\n"
	for i := 0; i <= 100; i++ {
		progress += "\r\x1b[0KProgress: " + strconv.Itoa(i) + "%"
	}
	progress += "\r\x1b[0K==> box: Creating image (snapshot of base box volume).\n"
	for _, tc := range []struct{ name, in, want string }{
		{"plain lines", "a\nb\n", "a\nb\n"},
		{"crlf", "a\r\nb\r\n", "a\nb\n"},
		{"vagrant's box upload", progress,
			"==> box: Uploading base box image as volume into Libvirt storage...\nProgress: 100%\n==> box: Creating image (snapshot of base box volume).\n"},
		{"progress ending the output", "x\rProgress: 1%\rProgress: 2%", "Progress: 1%\nProgress: 2%\n"},
		{"unterminated last line", "done", "done\n"},
		{"controls escaped", "a\x07b\n", "a\\x07b\n"},
		{"blank parts ignored", "one\r\x1b[K\rtwo\n", "one\ntwo\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			w := NewLineWriter(&out)
			// Byte by byte: a program's writes split anywhere.
			for i := range len(tc.in) {
				if _, err := w.Write([]byte{tc.in[i]}); err != nil {
					t.Fatal(err)
				}
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			if out.String() != tc.want {
				t.Errorf("got %q, want %q", out.String(), tc.want)
			}
		})
	}
}
