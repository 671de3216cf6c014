package initd

import (
	"encoding/json"
	"net"

	"golang.org/x/sys/unix"

	"github.com/arbor-env/arbor/sandbox/ctl"
)

// piece is one message of a job's answer: an output piece (resp.More,
// with its data) or the final Response.
type piece struct {
	resp ctl.Response
	data []byte
}

// inFlight is how many pieces a job may have queued for the connection;
// a command that writes faster than the server reads waits on its pipe.
const inFlight = 8

// output forwards one job's stdout and stderr to the server as init reads
// them (see ctl.Response) and counts them. Init keeps none of it: a
// command's output costs the sandbox's memory at most inFlight pieces,
// whatever max_output says, and the server caps what it keeps.
type output struct {
	send  chan<- piece
	total [3]int64 // by stream
}

// put queues p (copied) as an output piece of stream. It blocks while the
// connection is behind, which also holds up the command writing it.
func (o *output) put(stream int, p []byte) {
	o.total[stream] += int64(len(p))
	for len(p) > 0 {
		n := min(len(p), ctl.MaxChunk)
		o.send <- piece{resp: ctl.Response{More: true, Stream: stream, Chunk: n}, data: append([]byte(nil), p[:n]...)}
		p = p[n:]
	}
}

// to returns the function drain hands stream's bytes to: put, or nothing
// (drop them) when no command is collecting output.
func (o *output) to(stream int) func([]byte) {
	if o == nil {
		return nil
	}
	return func(p []byte) { o.put(stream, p) }
}

// finish fills in the byte counts of a job's answer.
func (o *output) finish(resp *ctl.Response) {
	resp.StdoutBytes, resp.StderrBytes = o.total[ctl.StreamStdout], o.total[ctl.StreamStderr]
}

// writePieces writes a job's pieces to c until its final Response. After
// a write error (the server hung up) it keeps taking them, so the pump is
// never stuck on a job nobody reads; the caller then closes c.
func writePieces(c net.Conn, pieces <-chan piece) error {
	var werr error
	for p := range pieces {
		if werr == nil {
			line, err := json.Marshal(p.resp)
			if err != nil {
				werr = err
			} else {
				bufs := net.Buffers{append(line, '\n')}
				if len(p.data) > 0 {
					bufs = append(bufs, p.data)
				}
				_, werr = bufs.WriteTo(c)
			}
		}
		if !p.resp.More {
			return werr
		}
	}
	return werr
}

// fionread is how many bytes wait in pipe fd.
func fionread(fd int) int {
	n, err := unix.IoctlGetInt(fd, unix.TIOCINQ) // FIONREAD
	if err != nil {
		return 0
	}
	return n
}
