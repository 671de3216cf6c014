package btrfs

import (
	"bufio"
	"fmt"
	"io"
	"path"
	"strconv"
	"strings"
)

// dumpOp is one command of `btrfs receive --dump` output.
type dumpOp struct {
	cmd  string
	path string // relative to the received subvolume, with a leading "/"
	dest string // for rename: the new path, same form
}

// contentOps are the stream commands that mean a file's data changed.
var contentOps = map[string]bool{
	"write": true, "update_extent": true, "truncate": true, "clone": true,
	"encoded_write": true, "fallocate": true,
}

// parseDump reads `btrfs receive --dump` output. The first line names the
// received subvolume ("snapshot ./NAME ..."); every path is printed as
// ./NAME/rel with the escapes of btrfs-progs' print_path_escaped.
func parseDump(r io.Reader) ([]dumpOp, error) {
	var ops []dumpOp
	prefix := ""
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.TrimSpace(line) == "" {
			continue
		}
		fields := splitEscaped(line)
		if len(fields) < 2 {
			return nil, fmt.Errorf("parse send dump: short line %q", line)
		}
		cmd := fields[0]
		p, err := unescape(fields[1])
		if err != nil {
			return nil, fmt.Errorf("parse send dump line %q: %w", line, err)
		}
		if cmd == "snapshot" || cmd == "subvol" {
			prefix = p
			continue
		}
		if prefix == "" {
			return nil, fmt.Errorf("parse send dump: %q before the snapshot line", line)
		}
		op := dumpOp{cmd: cmd, path: relTo(prefix, p)}
		if cmd == "rename" {
			for _, kv := range fields[2:] {
				if v, ok := strings.CutPrefix(kv, "dest="); ok {
					d, err := unescape(v)
					if err != nil {
						return nil, fmt.Errorf("parse send dump line %q: %w", line, err)
					}
					op.dest = relTo(prefix, d)
				}
			}
		}
		ops = append(ops, op)
	}
	return ops, sc.Err()
}

// relTo turns "./NAME/a/b" into "/a/b" and "./NAME/" into "/".
func relTo(prefix, p string) string {
	rel := strings.TrimPrefix(p, prefix)
	return path.Clean("/" + rel)
}

// splitEscaped splits a dump line on unescaped runs of spaces.
func splitEscaped(line string) []string {
	var fields []string
	var cur strings.Builder
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == '\\' && i+1 < len(line):
			cur.WriteByte(c)
			cur.WriteByte(line[i+1])
			i++
		case c == ' ':
			if cur.Len() > 0 {
				fields = append(fields, cur.String())
				cur.Reset()
			}
		default:
			cur.WriteByte(c)
		}
	}
	if cur.Len() > 0 {
		fields = append(fields, cur.String())
	}
	return fields
}

// unescape undoes print_path_escaped: \a \b \e \f \n \r \t \v, "\ ", "\\"
// and \ooo octal for other non-printable bytes.
func unescape(s string) (string, error) {
	if !strings.Contains(s, `\`) {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		i++
		switch c := s[i]; c {
		case 'a':
			b.WriteByte('\a')
		case 'b':
			b.WriteByte('\b')
		case 'e':
			b.WriteByte(0x1b)
		case 'f':
			b.WriteByte('\f')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 't':
			b.WriteByte('\t')
		case 'v':
			b.WriteByte('\v')
		default:
			if c >= '0' && c <= '7' && i+2 < len(s) {
				v, err := strconv.ParseUint(s[i:i+3], 8, 8)
				if err != nil {
					return "", fmt.Errorf("bad escape in %q: %w", s, err)
				}
				b.WriteByte(byte(v))
				i += 2
				continue
			}
			b.WriteByte(c)
		}
	}
	return b.String(), nil
}
