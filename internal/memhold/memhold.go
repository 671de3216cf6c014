// Package memhold is a process that holds a known pattern in memory and
// answers a checksum over it: tests and the benchmark restore it and check
// that every page came back (lazy restore, docs/engine.md).
package memhold

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
)

// The memory holder: a Python process (it needs python3: the debian image) that fills mb MiB of
// private anonymous memory with a pattern that differs on every page
// (0xa5 bytes, each 4 KiB page starting with its offset as 8 bytes little
// endian) and, on SIGUSR1, writes the SHA-256 of that memory to
// /tmp/memsum. A restore that loses or zeroes a page changes the sum.
const memHoldPy = `import hashlib, os, signal, sys
n = int(sys.argv[1]) << 20
b = bytearray(b'\xa5') * n
for i in range(0, n, 4096):
    b[i:i+8] = i.to_bytes(8, 'little')
def answer(*_):
    h = hashlib.sha256(b).hexdigest()
    with open('/tmp/memsum.new', 'w') as f:
        f.write(h)
    os.rename('/tmp/memsum.new', '/tmp/memsum')
signal.signal(signal.SIGUSR1, answer)
with open('/tmp/memhold.pid.new', 'w') as f:
    f.write(str(os.getpid()))
os.rename('/tmp/memhold.pid.new', '/tmp/memhold.pid')
while True:
    signal.pause()
`

// Start is a shell command that starts the memory holder with mb
// MiB in the background and returns once it holds them (at most 30 s).
func Start(mb int) string {
	return "cat > /tmp/memhold.py <<'ARBOR_EOF'\n" + memHoldPy + "ARBOR_EOF\n" +
		fmt.Sprintf("rm -f /tmp/memhold.pid; python3 /tmp/memhold.py %d </dev/null >/dev/null 2>&1 &\n", mb) +
		"for i in $(seq 600); do [ -f /tmp/memhold.pid ] && break; sleep 0.05; done; cat /tmp/memhold.pid"
}

// Sum is a shell command that prints the memory holder's SHA-256
// of its memory (empty when it does not answer within 20 s).
const Sum = "rm -f /tmp/memsum; kill -USR1 $(cat /tmp/memhold.pid) && " +
	"for i in $(seq 400); do [ -f /tmp/memsum ] && break; sleep 0.05; done; cat /tmp/memsum"

// Want is the SHA-256 the memory holder of mb MiB must answer.
func Want(mb int) string {
	n := mb << 20
	b := make([]byte, n)
	for i := range b {
		b[i] = 0xa5
	}
	for i := 0; i < n; i += 4096 {
		binary.LittleEndian.PutUint64(b[i:], uint64(i))
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
