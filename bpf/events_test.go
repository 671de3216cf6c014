package bpf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

// TestDecode encodes a trackerEvent field by field in little-endian order
// (encoding/binary, independent of the in-memory copy Decode makes) and
// checks that every field comes back, paths cut at their NUL.
func TestDecode(t *testing.T) {
	r := trackerEvent{Ts: 1 << 40, Cgid: 2<<32 | 3, Type: uint32(EventSyscall), Nr: 257, Pid: 11, Tgid: 12,
		Ret: -13, Arg: 0x40049409, Dirfd: [2]int32{-100, 5}, Flags: FlagPath0 | FlagFDFile, Mode: 0o100644,
		Ino: 1<<33 | 7, Dev: 0x803, Pad: 0xffffffff}
	paths := [4]string{"rel/x", "/work", "", string(bytes.Repeat([]byte("a"), len(r.Path[3])))}
	for i, p := range paths {
		for j := range len(p) {
			r.Path[i][j] = int8(p[j])
		}
	}
	var buf bytes.Buffer
	if err := binary.Write(&buf, binary.LittleEndian, &r); err != nil {
		t.Fatal(err)
	}
	if buf.Len() != EventSize {
		t.Fatalf("encoded %d bytes, EventSize %d", buf.Len(), EventSize)
	}
	e, err := Decode(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	want := Event{TS: r.Ts, CgroupID: r.Cgid, Type: EventSyscall, Nr: 257, PID: 11, TGID: 12, Ret: -13,
		Arg: 0x40049409, DirFD: [2]int32{-100, 5}, Flags: FlagPath0 | FlagFDFile, Mode: 0o100644,
		Ino: r.Ino, Dev: 0x803, Path: paths}
	if e != want {
		t.Errorf("decoded\n%+v\nwant\n%+v", e, want)
	}
	if _, err := Decode(buf.Bytes()[:EventSize-1]); !errors.Is(err, ErrShortEvent) {
		t.Errorf("short record: %v, want ErrShortEvent", err)
	}
}
