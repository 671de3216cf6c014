// Package shcmd builds the shell commands through which the file tools
// (read_file, write_file) run in a sandbox's shell, so they see the sandbox
// exactly as the agent's shell does (its cwd, its mounts) and need nothing
// beyond printf and cat in the image. The server's step tools and the agent
// tools both use it.
package shcmd

import (
	"strings"
	"unicode/utf8"
)

// Quote quotes s for any POSIX shell.
func Quote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// printfChunk bounds the escaped text of one printf call, below the
// kernel's 128 KiB cap on one argument in case printf is not a builtin.
const printfChunk = 32 << 10

// WriteFile is a shell command that writes content to path exactly, in
// any POSIX shell (bash, dash, busybox ash) and with no tool beyond
// printf: the bytes travel inside single-quoted printf %b arguments, with
// backslash, quote, control and invalid-UTF-8 bytes as \0NNN escapes. The
// parent directory is created. The command's exit status is printf's (or
// the redirection's).
func WriteFile(path string, content []byte) string {
	var b strings.Builder
	q := Quote(path)
	b.WriteString("mkdir -p -- \"$(dirname -- " + q + ")\" && { :")
	chunk := 0
	b.WriteString("; printf '%b' '")
	for len(content) > 0 {
		if chunk >= printfChunk {
			b.WriteString("'; printf '%b' '")
			chunk = 0
		}
		c := content[0]
		n := 1
		switch {
		case c == '\\' || c == '\'':
			chunk += writeOctal(&b, c)
		case c == '\n' || c == '\t' || (c >= 0x20 && c < 0x7f):
			b.WriteByte(c)
			chunk++
		case c >= 0x80:
			// Valid UTF-8 passes as is; stray bytes are escaped.
			r, size := utf8.DecodeRune(content)
			if r == utf8.RuneError && size <= 1 {
				chunk += writeOctal(&b, c)
			} else {
				b.Write(content[:size])
				chunk += size
				n = size
			}
		default:
			chunk += writeOctal(&b, c)
		}
		content = content[n:]
	}
	b.WriteString("'; } > " + q)
	return b.String()
}

func writeOctal(b *strings.Builder, c byte) int {
	b.WriteString(`\0`)
	b.WriteByte('0' + c>>6)
	b.WriteByte('0' + (c>>3)&7)
	b.WriteByte('0' + c&7)
	return 5
}

// ReadFile is a shell command that prints path's bytes on stdout.
func ReadFile(path string) string { return "cat -- " + Quote(path) }
