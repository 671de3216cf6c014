package inspector

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// chunk is what a content comparison reads of each file between two looks
// at its context and its budget.
const chunk = 1 << 20

// regular is a regular file found by stateOf: its host path and identity,
// so that the file opened for its content is the one whose metadata were
// compared.
type regular struct {
	host     string
	dev, ino uint64
	blocks   int64 // 512-byte blocks allocated
}

// sameContent reports whether regular files a and b, both size bytes long,
// hold the same data at the same offsets with the same holes. It walks the
// data extents of both (SEEK_DATA, SEEK_HOLE) in step and reads only data,
// charging bud for every byte before reading it: a hole is never read, so
// a sparse file costs what it holds, not its size. False (not proven
// equal) when the extents differ, a byte differs, a file changed under it,
// the extents found do not account for the blocks a file has allocated,
// or bud cannot cover the data; ctx's error when ctx ends (it is checked
// between chunks).
//
// The allocation check is what makes a hole trustworthy: SEEK_DATA can
// miss data (Linux 6.18's tmpfs does not see the last page of a file of
// 8 EiB - 1 bytes), and a byte it misses would otherwise compare equal.
// A file whose extents cover it whole has no hole to trust: it is equal
// once every byte compared equal.
func sameContent(ctx context.Context, bud *Budget, a, b regular, size int64) (bool, error) {
	// The allocated blocks are no exact measure of the data (preallocated
	// extents, compression), but a pair that cannot fit costs no read.
	if !bud.covers((a.blocks + b.blocks) * 512) {
		bud.unproven.Add(1)
		return false, nil
	}
	fa, blocksA, err := openRegular(a, size)
	if fa == nil || err != nil {
		return false, err
	}
	defer fa.Close()
	fb, blocksB, err := openRegular(b, size)
	if fb == nil || err != nil {
		return false, err
	}
	defer fb.Close()
	var found uint64      // bytes of the data extents, in whole blocks
	var bufA, bufB []byte // as large as the largest chunk read yet
	for off := int64(0); ; {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		da, ha, err := nextData(fa, off, size)
		if err != nil {
			return false, err
		}
		db, hb, err := nextData(fb, off, size)
		if err != nil {
			return false, err
		}
		if da != db || ha != hb {
			return false, nil
		}
		if da >= size {
			// Both files hold the same extents: found is each one's. When
			// they cover the whole file every byte was read; only a file
			// with holes needs its allocated blocks accounted for (ZFS
			// counts its metadata and compression in st_blocks, so a dense
			// file there would never prove equal).
			if found >= blocksIn(0, size) {
				return true, nil
			}
			return found >= uint64(blocksA)*512 && found >= uint64(blocksB)*512, nil
		}
		if ha <= da {
			return false, fmt.Errorf("seek in %s: hole at %d before data at %d", a.host, ha, da)
		}
		found += blocksIn(da, ha)
		for pos := da; pos < ha; {
			if err := ctx.Err(); err != nil {
				return false, err
			}
			n := min(chunk, ha-pos)
			if int64(len(bufA)) < n {
				bufA, bufB = make([]byte, n), make([]byte, n)
			}
			if !bud.take(2 * n) {
				bud.unproven.Add(1)
				return false, nil
			}
			okA, err := readFull(fa, bufA[:n], pos)
			if err != nil {
				return false, err
			}
			okB, err := readFull(fb, bufB[:n], pos)
			if err != nil {
				return false, err
			}
			bud.read.Add(2 * n)
			if bud.afterChunk != nil {
				bud.afterChunk()
			}
			if !okA || !okB || !bytes.Equal(bufA[:n], bufB[:n]) {
				return false, nil
			}
			pos += n
		}
		off = ha
	}
}

// block is the unit in which extents are counted against the allocated
// blocks: the data extents a file system reports are whole blocks but for
// the one that ends the file (or is stored inline).
const block = 4096

// blocksIn is the extent [data, hole) in whole blocks, in bytes; unsigned,
// as the last block of a file of 8 EiB - 1 bytes ends at 2^63.
func blocksIn(data, hole int64) uint64 {
	return (uint64(hole)+block-1)&^(block-1) - uint64(data)&^(block-1)
}

// openRegular opens r for reading and returns it with its allocated
// 512-byte blocks, or nil when what is there now is not the file stateOf
// saw (replaced, or resized: changed).
func openRegular(r regular, size int64) (*os.File, int64, error) {
	f, err := os.OpenFile(r.host, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("open %s: %w", r.host, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, 0, fmt.Errorf("fstat %s: %w", r.host, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Dev != r.dev || st.Ino != r.ino || st.Size != size {
		f.Close()
		return nil, 0, nil
	}
	return f, st.Blocks, nil
}

// nextData returns the data extent [data, hole) of f at or after off;
// data is size when nothing but holes follow. A file system that cannot
// seek to data shows the rest of the file as one extent.
func nextData(f *os.File, off, size int64) (data, hole int64, err error) {
	if off >= size {
		return size, size, nil
	}
	fd := int(f.Fd())
	data, err = unix.Seek(fd, off, unix.SEEK_DATA)
	switch {
	case errors.Is(err, unix.ENXIO):
		return size, size, nil
	case errors.Is(err, unix.EINVAL), errors.Is(err, unix.EOPNOTSUPP):
		return off, size, nil
	case err != nil:
		return 0, 0, fmt.Errorf("seek data in %s: %w", f.Name(), err)
	}
	hole, err = unix.Seek(fd, data, unix.SEEK_HOLE)
	switch {
	case errors.Is(err, unix.ENXIO):
		// The file shrank in between: its read will fail.
		return data, size, nil
	case err != nil:
		return 0, 0, fmt.Errorf("seek hole in %s: %w", f.Name(), err)
	}
	if hole < data || hole > size {
		// Linux 6.18's btrfs answers the hole after data in the last
		// page of a file of 8 EiB - 1 bytes with offset 2^63, wrapped.
		hole = size
	}
	return data, hole, nil
}

// readFull reads len(buf) bytes at off; false when the file ends first
// (it shrank since it was opened).
func readFull(f *os.File, buf []byte, off int64) (bool, error) {
	_, err := f.ReadAt(buf, off)
	if errors.Is(err, io.EOF) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read %s: %w", f.Name(), err)
	}
	return true, nil
}
