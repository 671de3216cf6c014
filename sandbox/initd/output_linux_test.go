package initd

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net"
	"testing"

	"github.com/arbor-env/arbor/sandbox/ctl"
)

// TestOutputPutSplitsIntoPieces: output goes in full pieces, the rest
// at finish, small writes together.
func TestOutputPutSplitsIntoPieces(t *testing.T) {
	ch := make(chan piece, 8)
	o := &output{send: ch}
	data := bytes.Repeat([]byte("x"), 2*ctl.MaxChunk+10)
	o.put(ctl.StreamStderr, data)
	for i := 0; i < 3; i++ {
		o.put(ctl.StreamStdout, []byte("o"))
	}
	if len(ch) != 2 {
		t.Errorf("%d pieces sent before finish, want the 2 full ones", len(ch))
	}
	var resp ctl.Response
	o.finish(&resp)
	if resp.StdoutBytes != 3 || resp.StderrBytes != int64(len(data)) {
		t.Errorf("counts %d %d, want 3 %d", resp.StdoutBytes, resp.StderrBytes, len(data))
	}
	want := []struct{ stream, n int }{{ctl.StreamStderr, ctl.MaxChunk}, {ctl.StreamStderr, ctl.MaxChunk}, {ctl.StreamStdout, 3}, {ctl.StreamStderr, 10}}
	if len(ch) != len(want) {
		t.Fatalf("%d pieces, want %d", len(ch), len(want))
	}
	for i, w := range want {
		p := <-ch
		if !p.resp.More || p.resp.Stream != w.stream || p.resp.Chunk != w.n || len(p.data) != w.n {
			t.Errorf("piece %d: %+v with %d bytes, want stream %d, %d bytes", i, p.resp, len(p.data), w.stream, w.n)
		}
	}
}

// TestWritePiecesFraming reads what writePieces sends as the server does:
// each piece's line, then its raw bytes, then the answer.
func TestWritePiecesFraming(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	ch := make(chan piece, 3)
	ch <- piece{resp: ctl.Response{More: true, Stream: ctl.StreamStdout, Chunk: 4}, data: []byte("a\nb\n")}
	ch <- piece{resp: ctl.Response{More: true, Stream: ctl.StreamStderr, Chunk: 2}, data: []byte("{}")}
	ch <- piece{resp: ctl.Response{ExitCode: 3, StdoutBytes: 4, StderrBytes: 2}}
	errc := make(chan error, 1)
	go func() { errc <- writePieces(a, ch) }()
	rd := bufio.NewReader(b)
	var got []string
	for {
		line, err := rd.ReadBytes('\n')
		if err != nil {
			t.Fatal(err)
		}
		var r ctl.Response
		if err := json.Unmarshal(line, &r); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		if !r.More {
			if r.ExitCode != 3 {
				t.Errorf("answer %+v", r)
			}
			break
		}
		buf := make([]byte, r.Chunk)
		if _, err := io.ReadFull(rd, buf); err != nil {
			t.Fatal(err)
		}
		got = append(got, string(buf))
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != "a\nb\n" || got[1] != "{}" {
		t.Errorf("pieces %q", got)
	}
}

// TestWritePiecesAfterHangUp: when the server is gone, writePieces still
// takes every piece up to the answer, so the pump never blocks on a job.
func TestWritePiecesAfterHangUp(t *testing.T) {
	a, b := net.Pipe()
	b.Close()
	defer a.Close()
	ch := make(chan piece, 4)
	for i := 0; i < 3; i++ {
		ch <- piece{resp: ctl.Response{More: true, Stream: ctl.StreamStdout, Chunk: 1}, data: []byte("x")}
	}
	ch <- piece{resp: ctl.Response{}}
	if err := writePieces(a, ch); err == nil {
		t.Error("no error writing to a closed connection")
	}
	if len(ch) != 0 {
		t.Errorf("%d pieces left", len(ch))
	}
}
