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

// output forwards one job's stdout and stderr to the server (see
// ctl.Response) and counts them. Init keeps none of it: a command's output
// costs the sandbox's memory a piece being filled per stream and at most
// inFlight pieces queued, whatever max_output says; the server caps what
// it keeps. Pieces are sent full (ctl.MaxChunk) but the last one, which
// flush sends: a piece per pipe read (a few KiB) cost more than the read.
type output struct {
	send  chan<- piece
	total [3]int64  // by stream
	fill  [3][]byte // the piece being filled, by stream
}

// pieceBufs holds the buffers of pieces written, for reuse.
var pieceBufs = make(chan []byte, inFlight+4)

func newPieceBuf() []byte {
	select {
	case b := <-pieceBufs:
		return b[:0]
	default:
		return make([]byte, 0, ctl.MaxChunk)
	}
}

// put adds p (copied) to stream, sending each piece that fills up. It
// blocks while the connection is behind, which also holds up the command
// writing the output.
func (o *output) put(stream int, p []byte) {
	o.total[stream] += int64(len(p))
	for len(p) > 0 {
		b := o.fill[stream]
		if b == nil {
			b = newPieceBuf()
		}
		n := min(len(p), ctl.MaxChunk-len(b))
		b, p = append(b, p[:n]...), p[n:]
		o.fill[stream] = b
		if len(b) == ctl.MaxChunk {
			o.sendPiece(stream)
		}
	}
}

func (o *output) sendPiece(stream int) {
	b := o.fill[stream]
	o.fill[stream] = nil
	o.send <- piece{resp: ctl.Response{More: true, Stream: stream, Chunk: len(b)}, data: b}
}

// flush sends what the pieces being filled hold.
func (o *output) flush() {
	for stream, b := range o.fill {
		if len(b) > 0 {
			o.sendPiece(stream)
		}
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

// finish sends the rest of the output and fills in the byte counts of a
// job's answer.
func (o *output) finish(resp *ctl.Response) {
	o.flush()
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
		if cap(p.data) == ctl.MaxChunk {
			select {
			case pieceBufs <- p.data:
			default:
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
