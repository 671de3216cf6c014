package btrfs

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// The start of a btrfs send stream (btrfs-progs' send.h): a header, then
// commands, each a header (length of its attributes, command, crc32c)
// and type-length-value attributes. The first command makes the
// subvolume (subvol, or snapshot for an incremental stream) and names it
// in its path attribute.
const (
	streamMagic    = "btrfs-stream\x00"
	streamHdrLen   = len(streamMagic) + 4
	cmdHdrLen      = 4 + 2 + 4
	cmdSubvol      = 1
	cmdSnapshot    = 2
	attrPath       = 15
	maxFirstCmdLen = 64 << 10
)

// streamSubvol returns the name of the subvolume a send stream makes
// (its first command's path), from the stream's first bytes; more is the
// number of bytes it needs when b is too short.
func streamSubvol(b []byte) (name string, incremental bool, more int, err error) {
	if len(b) < streamHdrLen+cmdHdrLen {
		return "", false, streamHdrLen + cmdHdrLen, nil
	}
	if !bytes.Equal(b[:len(streamMagic)], []byte(streamMagic)) {
		return "", false, 0, fmt.Errorf("not a btrfs send stream")
	}
	c := b[streamHdrLen:]
	n := int(binary.LittleEndian.Uint32(c[0:4]))
	cmd := binary.LittleEndian.Uint16(c[4:6])
	if cmd != cmdSubvol && cmd != cmdSnapshot {
		return "", false, 0, fmt.Errorf("send stream starts with command %d, not a subvolume", cmd)
	}
	if n > maxFirstCmdLen {
		return "", false, 0, fmt.Errorf("send stream's first command of %d bytes", n)
	}
	if len(b) < streamHdrLen+cmdHdrLen+n {
		return "", false, streamHdrLen + cmdHdrLen + n, nil
	}
	attrs := c[cmdHdrLen : cmdHdrLen+n]
	for len(attrs) >= 4 {
		typ := binary.LittleEndian.Uint16(attrs[0:2])
		l := int(binary.LittleEndian.Uint16(attrs[2:4]))
		if len(attrs) < 4+l {
			break
		}
		if typ == attrPath {
			return string(attrs[4 : 4+l]), cmd == cmdSnapshot, 0, nil
		}
		attrs = attrs[4+l:]
	}
	return "", false, 0, fmt.Errorf("send stream's first command names no subvolume")
}
