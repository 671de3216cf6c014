package btrfs

import (
	"encoding/binary"
	"testing"
)

func TestStreamSubvol(t *testing.T) {
	mk := func(cmd uint16, name string) []byte {
		attr := binary.LittleEndian.AppendUint16(nil, 1) // uuid first: skipped
		attr = binary.LittleEndian.AppendUint16(attr, 2)
		attr = append(attr, 0, 0)
		attr = binary.LittleEndian.AppendUint16(attr, attrPath)
		attr = binary.LittleEndian.AppendUint16(attr, uint16(len(name)))
		attr = append(attr, name...)
		b := append([]byte(streamMagic), 1, 0, 0, 0)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(attr)))
		b = binary.LittleEndian.AppendUint16(b, cmd)
		b = append(b, 0, 0, 0, 0)
		return append(b, attr...)
	}
	tests := []struct {
		name    string
		b       []byte
		want    string
		incr    bool
		wantErr bool
	}{
		{name: "subvol", b: mk(cmdSubvol, "f1"), want: "f1"},
		{name: "snapshot", b: mk(cmdSnapshot, "f2"), want: "f2", incr: true},
		{name: "other command", b: mk(3, "f1"), wantErr: true},
		{name: "not a stream", b: append([]byte("btrfs-strean\x00"), make([]byte, 20)...), wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, incr, more, err := streamSubvol(tt.b)
			if (err != nil) != tt.wantErr || got != tt.want || incr != tt.incr || more != 0 {
				t.Errorf("streamSubvol: %q %v %d %v", got, incr, more, err)
			}
		})
	}
	// Short input asks for more, never fails.
	b := mk(cmdSubvol, "f1")
	for i := 0; i < len(b); i++ {
		if _, _, more, err := streamSubvol(b[:i]); err != nil || more <= i {
			t.Fatalf("%d bytes: more %d, err %v", i, more, err)
		}
	}
}
