// Package procfs reads the small files of /proc and of the cgroup file
// system that the Inspector and the sandbox read on every turn, with fewer
// system calls than os.ReadFile: open, read to the end, close. os.ReadFile
// also stats the file to size its buffer and registers the descriptor with
// the runtime's poller (fcntl and epoll_ctl, which these files refuse),
// which doubled the calls of a turn's classification (docs/inspector.md,
// "Cost").
package procfs

import (
	"errors"
	"os"
	"slices"

	"golang.org/x/sys/unix"
)

// ErrTooLarge is the error of ReadFileMax and ReadDirNamesMax for a file
// or folder larger than their bound (wrapped in an *os.PathError).
var ErrTooLarge = errors.New("larger than the bound")

// ReadFile reads the whole of the file at path, like os.ReadFile, and
// fails with the same *os.PathError.
func ReadFile(path string) ([]byte, error) {
	return ReadFileMax(path, -1)
}

// ReadFileMax is ReadFile for a file of at most max bytes (max < 0: no
// bound); a longer one fails with ErrTooLarge after max+1 bytes read. A
// sandbox's process decides how long its /proc files are (65530 mappings
// make a maps file of megabytes), so what the server reads of them is
// bounded (docs/inspector.md, "Cost").
func ReadFileMax(path string, max int) ([]byte, error) {
	fd, err := openRetry(path)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	b := make([]byte, 0, 1024)
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := unix.Read(fd, b[len(b):cap(b)])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "read", Path: path, Err: err}
		}
		if n == 0 {
			return b, nil
		}
		b = b[:len(b)+n]
		if max >= 0 && len(b) > max {
			return nil, &os.PathError{Op: "read", Path: path, Err: ErrTooLarge}
		}
	}
}

func openRetry(path string) (int, error) {
	for {
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// ReadDirNames lists the names in the directory at path (a process's fd
// or task folder) sorted by name, without "." and "..", as os.ReadDir
// does, and fails like it with an *os.PathError.
func ReadDirNames(path string) ([]string, error) {
	return ReadDirNamesMax(path, -1)
}

// ReadDirNamesMax is ReadDirNames for a folder of at most max names (max
// < 0: no bound); a larger one fails with ErrTooLarge once more than max
// were read, so a process holding a million descriptors costs the reader
// a bounded amount.
func ReadDirNamesMax(path string, max int) ([]string, error) {
	fd, err := openRetry(path)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	var names []string
	buf := make([]byte, 8192)
	for {
		n, err := unix.Getdents(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "readdirent", Path: path, Err: err}
		}
		if n <= 0 {
			slices.Sort(names)
			return names, nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
		if max >= 0 && len(names) > max {
			return nil, &os.PathError{Op: "readdirent", Path: path, Err: ErrTooLarge}
		}
	}
}
