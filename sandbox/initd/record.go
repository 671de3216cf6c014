package initd

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
)

// statusSep frames the status record the shell writes after each command:
// "\036NONCE SEQ EXIT PWD\036". The leading separator ends whatever
// unterminated bytes came before it, so junk cannot glue itself to the
// front of a real record.
const statusSep = '\036'

// maxPending bounds the unterminated tail kept between reads: a record is
// at most a nonce, two numbers and a path (PATH_MAX).
const maxPending = 16 << 10

// nonceLen is the length in hex digits of a command's nonce (128 bits).
const nonceLen = 32

// A record is one status record: which command (nonce and sequence
// number) it reports, its exit status and the shell's $PWD after it.
type record struct {
	nonce string
	seq   uint64
	code  int
	pwd   string
}

// newNonce returns a fresh random nonce: the shell learns it from the
// line that runs the command and nothing else in the sandbox can know it
// before that line is read.
func newNonce() string {
	var b [nonceLen / 2]byte
	if _, err := rand.Read(b[:]); err != nil {
		// crypto/rand does not fail on Linux (getrandom); a sandbox
		// without randomness must not run commands with guessable nonces.
		panic(fmt.Sprintf("read random nonce: %v", err))
	}
	return hex.EncodeToString(b[:])
}

// statusCmd is the shell command that writes the status record of the
// command just run (its "$?" and "$PWD") to fd, tagged with nonce and seq.
// command and the backslashes keep aliases and functions named printf
// out of the way.
func statusCmd(nonce string, seq uint64, fd int) string {
	return fmt.Sprintf(`\command \printf '\036%%s %%s %%s %%s\036' %s %d "$?" "$PWD" >&%d`, nonce, seq, fd)
}

// splitRecords cuts the status bytes received so far into records. It
// returns the well-formed records, the unterminated tail to keep for the
// next read, and how many pieces it dropped as malformed (or because the
// tail grew beyond any real record).
func splitRecords(buf []byte) (recs []record, rest []byte, junk int) {
	for {
		i := bytes.IndexByte(buf, statusSep)
		if i < 0 {
			break
		}
		piece := buf[:i]
		buf = buf[i+1:]
		if len(piece) == 0 {
			continue
		}
		r, ok := parseRecord(piece)
		if !ok {
			junk++
			continue
		}
		recs = append(recs, r)
	}
	if len(buf) > maxPending {
		return recs, nil, junk + 1
	}
	return recs, buf, junk
}

// parseRecord reads "NONCE SEQ EXIT PWD".
func parseRecord(p []byte) (record, bool) {
	f := bytes.SplitN(p, []byte(" "), 4)
	if len(f) != 4 || len(f[0]) != nonceLen {
		return record{}, false
	}
	if _, err := hex.DecodeString(string(f[0])); err != nil {
		return record{}, false
	}
	seq, err := strconv.ParseUint(string(f[1]), 10, 64)
	if err != nil || seq == 0 {
		return record{}, false
	}
	code, err := strconv.Atoi(string(f[2]))
	if err != nil || code < 0 || code > 255 {
		return record{}, false
	}
	return record{nonce: string(f[0]), seq: seq, code: code, pwd: string(f[3])}, true
}

// expected is the set of records init waits for: sequence number to
// nonce. A record is accepted only when both match, and only once.
type expected map[uint64]string

// take reports whether r is awaited and, if so, stops awaiting it.
func (e expected) take(r record) bool {
	n, ok := e[r.seq]
	if !ok || n != r.nonce {
		return false
	}
	delete(e, r.seq)
	return true
}
