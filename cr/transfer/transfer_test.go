package transfer

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/arbor-env/arbor/cr/manifest"
	"github.com/arbor-env/arbor/state"
)

func stream(t *testing.T, parts ...string) ([]byte, Header) {
	t.Helper()
	h := Header{State: manifest.State{ID: "s1", Env: "e1", FS: "f1", Proc: "p1", Kind: state.Full}, Image: "busybox"}
	ids := []Part{{Artifact: manifest.Artifact{ID: "f1", Kind: manifest.ArtifactFS}, Base: "f0"}, {Artifact: manifest.Artifact{ID: "p1", Kind: manifest.ArtifactProc}}}
	h.Parts = ids[:len(parts)]
	var buf bytes.Buffer
	w, err := NewWriter(&buf, h)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range parts {
		pw, err := w.Part()
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(pw, strings.NewReader(p))
		if err := pw.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if w.Bytes() != int64(buf.Len()) {
		t.Errorf("Bytes %d, wrote %d", w.Bytes(), buf.Len())
	}
	return buf.Bytes(), h
}

// read reads every part and verifies; it returns the parts and the error.
func read(b []byte) ([]string, error) {
	r, err := NewReader(bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	var out []string
	for range r.Header().Parts {
		p, err := r.Next()
		if err != nil {
			return out, err
		}
		data, err := io.ReadAll(p)
		if err != nil {
			return out, err
		}
		out = append(out, string(data))
	}
	return out, r.Verify()
}

func TestRoundTrip(t *testing.T) {
	big := strings.Repeat("x", 3*ChunkSize+17)
	b, _ := stream(t, big, "")
	got, err := read(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != big || got[1] != "" {
		t.Errorf("parts: %d, sizes %d", len(got), len(got[0]))
	}
}

func TestDamagedStreams(t *testing.T) {
	b, _ := stream(t, strings.Repeat("data", 1000), "image")
	flip := func(i int) []byte {
		c := bytes.Clone(b)
		c[i] ^= 0x40
		return c
	}
	tests := []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"magic", flip(0)},
		{"header byte", flip(len(Magic) + 10)},
		{"payload byte", flip(len(b) / 2)},
		{"trailer byte", flip(len(b) - 1)},
		{"cut in a part", b[:len(b)/2]},
		{"cut before the trailer", b[:len(b)-32]},
		{"cut in the trailer", b[:len(b)-5]},
		{"bytes after the trailer", append(bytes.Clone(b), 0)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := read(tt.b)
			if !errors.Is(err, ErrCorrupt) {
				t.Errorf("err %v, want ErrCorrupt", err)
			}
		})
	}
}

func TestHeaderNamesOnlyTheStatesArtifacts(t *testing.T) {
	h := Header{State: manifest.State{ID: "s1", Env: "e1", FS: "f1"},
		Parts: []Part{{Artifact: manifest.Artifact{ID: "f9", Kind: manifest.ArtifactFS}}}}
	if err := h.Validate(); !errors.Is(err, ErrCorrupt) {
		t.Errorf("foreign artifact: %v", err)
	}
}
