package shcmd_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/arbor-env/arbor/sandbox/shcmd"
)

// TestWriteFileRoundTrip runs the commands in the host's POSIX shells and
// checks that every byte arrives.
func TestWriteFileRoundTrip(t *testing.T) {
	tests := []struct {
		name    string
		content []byte
	}{
		{"text", []byte("hello\nworld\n")},
		{"quotes and backslashes", []byte(`it's "quoted" \n not a newline \\`)},
		{"binary", func() []byte {
			b := make([]byte, 256)
			for i := range b {
				b[i] = byte(i)
			}
			return b
		}()},
		{"utf-8 and stray bytes", []byte("héllo \xff\xfe wörld")},
		{"large", bytes.Repeat([]byte("0123456789abcdef'\\"), 10000)},
		{"empty", nil},
	}
	for _, shell := range []string{"/bin/sh", "/bin/bash", "/bin/busybox"} {
		if _, err := os.Stat(shell); err != nil {
			continue
		}
		for _, tt := range tests {
			t.Run(filepath.Base(shell)+"/"+tt.name, func(t *testing.T) {
				path := filepath.Join(t.TempDir(), "sub dir", "it's a file")
				// The script goes on stdin, as in a sandbox it goes through a
				// file: one argv string is limited to 128 KiB.
				args := []string{"-s"}
				if filepath.Base(shell) == "busybox" {
					args = append([]string{"sh"}, args...)
				}
				cmd := exec.Command(shell, args...)
				cmd.Stdin = strings.NewReader(shcmd.WriteFile(path, tt.content))
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("%v: %s", err, out)
				}
				got, err := exec.Command("/bin/sh", "-c", shcmd.ReadFile(path)).Output()
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, tt.content) {
					t.Errorf("round trip changed the content: %d bytes in, %d out", len(tt.content), len(got))
				}
			})
		}
	}
}
