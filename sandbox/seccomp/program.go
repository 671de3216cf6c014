package seccomp

// Program is a compiled filter: the bytes of a struct sock_filter array
// as seccomp(SECCOMP_SET_MODE_FILTER) takes it.
type Program struct {
	BPF []byte
	// Skipped lists the profile's syscalls libseccomp does not know (newer
	// than it); they stay denied by the default action.
	Skipped []string
}

// Instructions is the program's length in BPF instructions.
func (p *Program) Instructions() int { return len(p.BPF) / 8 }
