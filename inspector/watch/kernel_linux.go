package watch

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/arbor-env/arbor/inspector"
	"github.com/arbor-env/arbor/sandbox/ctl"
)

// kernelFacts turns an env's effect calls and stream objects into facts:
// every effect makes the turn proc; an object does when a process that
// outlives the turn holds it (a descriptor or a mapping of the same
// inode), and a socket call does when such a process holds any socket
// (the peer of a datagram or a connection has an inode of its own). Init
// is not such a process: what it holds is the harness's (the pipes of
// commands' output, the peers of the shell's channels), and so are the
// shell's own channel descriptors (ctl.ShellCmdFD...ctl.ShellStatusFD).
func kernelFacts(s *scan, shellNS int, effects []string, objects map[objKey]Object) []inspector.Fact {
	var facts []inspector.Fact
	for _, why := range effects {
		facts = append(facts, inspector.Fact{Kind: inspector.KernelChanged, Detail: why})
	}
	if len(objects) == 0 {
		return facts
	}
	if s.err != nil {
		return append(facts, inspector.Fact{Kind: inspector.KernelChanged, Detail: fmt.Sprintf("list the descriptors of the processes: %v", s.err)})
	}
	h := holdersOf(s, shellNS)
	if s.over != "" {
		return append(facts, s.overFact()...)
	}
	keys := make([]objKey, 0, len(objects))
	for k := range objects {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		return keys[i].ino < keys[j].ino || keys[i].ino == keys[j].ino && keys[i].typ < keys[j].typ
	})
	for _, k := range keys {
		o := objects[k]
		if h.harness[k] || int(o.PID) == h.init {
			continue // the harness's: init serves the server's connections
		}
		if who, ok := h.byIno[k]; ok {
			facts = append(facts, inspector.Fact{Kind: inspector.KernelChanged, PID: int(o.PID),
				Detail: fmt.Sprintf("%s, held by %s", o, who)})
			continue
		}
		if o.Mode&unix.S_IFMT == unix.S_IFSOCK && h.socket != "" {
			facts = append(facts, inspector.Fact{Kind: inspector.KernelChanged, PID: int(o.PID),
				Detail: fmt.Sprintf("%s while %s", o, h.socket)})
		}
	}
	return facts
}

// objKey names an inode by its number and file type (S_IFMT): pipes,
// sockets and files number their inodes apart.
type objKey struct {
	ino uint64
	typ uint32
}

func keyOf(o Object) objKey { return objKey{o.Ino, o.Mode & unix.S_IFMT} }

// holders is what the processes of a sandbox hold.
type holders struct {
	byIno   map[objKey]string // inode -> "process P (comm) fd N"
	socket  string            // a socket a non-harness holder holds, described
	harness map[objKey]bool   // inodes init holds, and the shell at its channels
	init    int               // init's host pid
}

// holdersOf reads the descriptors and mappings of every process of s.
func holdersOf(s *scan, shellNS int) holders {
	h := holders{byIno: map[objKey]string{}, harness: map[objKey]bool{}}
	for _, p := range s.procs {
		pid, ns, comm := p.pid, p.ns, p.comm
		if ns == 0 {
			continue // gone meanwhile
		}
		if ns == 1 {
			h.init = pid
		}
		dir := fmt.Sprintf("/proc/%d/fd", pid)
		for _, fe := range s.fdsOf(p) {
			fd, link := fe.fd, fe.link
			var k objKey
			sock := false
			switch {
			case strings.HasPrefix(link, "pipe:["):
				k.ino, _ = strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(link, "pipe:["), "]"), 10, 64)
				k.typ = unix.S_IFIFO
			case strings.HasPrefix(link, "socket:["):
				k.ino, _ = strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]"), 10, 64)
				k.typ, sock = unix.S_IFSOCK, true
			case strings.HasPrefix(link, "anon_inode:"):
				continue // one inode for every anonymous file
			default:
				var st unix.Stat_t
				if unix.Stat(dir+"/"+strconv.Itoa(fd), &st) != nil {
					continue
				}
				k = objKey{st.Ino, st.Mode & unix.S_IFMT}
			}
			if ns == 1 || ns == shellNS && fd >= ctl.ShellCmdFD && fd <= ctl.ShellStatusFD {
				h.harness[k] = true
				continue
			}
			who := fmt.Sprintf("process %d (%s) fd %d", pid, comm, fd)
			if _, ok := h.byIno[k]; !ok {
				h.byIno[k] = who
			}
			if sock && h.socket == "" {
				h.socket = fmt.Sprintf("%s holds socket:[%d]", who, k.ino)
			}
		}
		if ns == 1 {
			continue
		}
		// Memory files mapped (a memfd a daemon mapped and closed).
		for _, line := range strings.Split(string(s.mapsOf(p)), "\n") {
			fs := strings.Fields(line)
			if len(fs) < 6 {
				continue
			}
			if ino, _ := strconv.ParseUint(fs[4], 10, 64); ino != 0 {
				if k := (objKey{ino, unix.S_IFREG}); h.byIno[k] == "" {
					h.byIno[k] = fmt.Sprintf("process %d (%s), which maps %s", pid, comm, strings.Join(fs[5:], " "))
				}
			}
		}
	}
	return h
}
