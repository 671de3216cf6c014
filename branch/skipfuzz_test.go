package branch_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/branch/branchtest"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/state"
)

// The differential turn fuzzer (docs/inspector.md, "What a restore brings
// back"): random agent turns from a grammar; after every turn the engine
// classifies and checkpoints it as the server does, and when the
// checkpoint skipped a part (none, fs or proc) a branch of the turn's state
// is probed and compared with the live env. The probe reads, from inside
// the sandbox and without changing anything that lasts, what a restore
// brings back: the files under /work and /tmp with their metadata and
// content, the shell's variables, aliases, traps, options, umask, limits,
// cwd, jobs and open descriptors (target, flags but O_LARGEFILE, which
// CRIU adds to the terminal it restores and which no program observes on
// x86_64, offset), and every
// long-lived process with its state and pending signals. It leaves out two
// documented gaps (docs/inspector.md, "What a restore brings back"):
// directory mtimes, and a SIGSTOP pending in a process already stopped
// (CRIU drops it; SIGCONT would discard it anyway); and it reads a
// descriptor of a deleted file, which CRIU restores through a temporary
// link named NAME.cr_link, as NAME (deleted). It does not use the
// inspector's digests but reads the sandbox from inside, so a digest that
// leaves something out is caught where the probe reads it; what neither
// reads (process memory beyond what the turns make observable) the
// fuzzer cannot judge.
//
// A second oracle shares none of the probe's choices of what to read:
// the live env's and the branch's process trees dumped by CRIU and
// compared image field by image field (oracle_test.go, cr/imgcompare;
// docs/inspector.md, "The CRIU oracle"), on every
// ARBOR_SKIPFUZZ_CRIU_EVERY-th checked turn (3; make fuzz-skips: 1).
//
// make test runs a seeded budget (ARBOR_SKIPFUZZ_TURNS, default 60 turns)
// on busybox (ARBOR_SKIPFUZZ_IMAGE=debian adds bash's arrays, attributes,
// directory stack and shopt);
// make fuzz-skips runs a long one by time (ARBOR_SKIPFUZZ_FOR) and writes
// a report (ARBOR_SKIPFUZZ_REPORT). ARBOR_SKIPFUZZ_SEED replays a run,
// ARBOR_SKIPFUZZ_REPLAY one sequence of turns (one a line).

// fuzzPaths are few, so that turns often meet the same files.
var (
	fuzzFiles = []string{"/work/f0", "/work/f1", "/work/f2", "/tmp/t0"}
	fuzzDirs  = []string{"/work/d0", "/work/d1"}
)

// turnGen makes one random turn.
type turnGen struct {
	weight int
	make   func(r *rand.Rand) string
}

func pick[T any](r *rand.Rand, xs []T) T { return xs[r.Intn(len(xs))] }

var turnGrammar = []turnGen{
	// Files: content, through many calls.
	{6, func(r *rand.Rand) string { return fmt.Sprintf("echo %d > %s", r.Intn(5), pick(r, fuzzFiles)) }},
	{3, func(r *rand.Rand) string { return fmt.Sprintf("printf x >> %s", pick(r, fuzzFiles)) }},
	{2, func(r *rand.Rand) string { return fmt.Sprintf(": > %s", pick(r, fuzzFiles)) }},
	{2, func(r *rand.Rand) string {
		return fmt.Sprintf("dd if=/dev/zero of=%s bs=1 count=1 seek=%d conv=notrunc 2>/dev/null", pick(r, fuzzFiles), r.Intn(8))
	}},
	{2, func(r *rand.Rand) string { return fmt.Sprintf("truncate -s %d %s", r.Intn(6), pick(r, fuzzFiles)) }},
	{3, func(r *rand.Rand) string { return "rm -f " + pick(r, fuzzFiles) }},
	{2, func(r *rand.Rand) string { return fmt.Sprintf("mv -f %s %s", pick(r, fuzzFiles), pick(r, fuzzFiles)) }},
	{2, func(r *rand.Rand) string { return fmt.Sprintf("cp -f %s %s", pick(r, fuzzFiles), pick(r, fuzzFiles)) }},
	{2, func(r *rand.Rand) string { return fmt.Sprintf("ln -f %s %s", pick(r, fuzzFiles), pick(r, fuzzFiles)) }},
	{2, func(r *rand.Rand) string { return fmt.Sprintf("ln -sfn %s /work/l%d", pick(r, fuzzFiles), r.Intn(2)) }},
	// Metadata only.
	{3, func(r *rand.Rand) string { return fmt.Sprintf("chmod %o %s", 0o600+r.Intn(0o100), pick(r, fuzzFiles)) }},
	{2, func(r *rand.Rand) string {
		return fmt.Sprintf("chown %d:%d %s", r.Intn(3), r.Intn(3), pick(r, fuzzFiles))
	}},
	{3, func(r *rand.Rand) string {
		return fmt.Sprintf("touch -d '2001-02-03 04:05:%02d' %s", r.Intn(60), pick(r, fuzzFiles))
	}},
	{2, func(r *rand.Rand) string { return "touch " + pick(r, fuzzFiles) }},
	{2, func(r *rand.Rand) string { return "mkdir -p " + pick(r, fuzzDirs) }},
	{2, func(r *rand.Rand) string { return "rmdir " + pick(r, fuzzDirs) + " 2>/dev/null" }},
	{1, func(r *rand.Rand) string {
		return fmt.Sprintf("rm -f /work/p%d; mkfifo /work/p%d", r.Intn(2), r.Intn(2))
	}},
	{2, func(r *rand.Rand) string { return "echo tmp > /tmp/scratch && rm /tmp/scratch" }},
	// Read only.
	{5, func(r *rand.Rand) string {
		return "cat " + pick(r, fuzzFiles) + " >/dev/null 2>&1; ls -l /work >/dev/null"
	}},
	{2, func(r *rand.Rand) string { return "true" }},
	{1, func(r *rand.Rand) string { return "false" }},
	// The shell's own state.
	{3, func(r *rand.Rand) string {
		return "cd " + pick(r, append([]string{"/", "/work", "/tmp"}, fuzzDirs...)) + " 2>/dev/null"
	}},
	{3, func(r *rand.Rand) string { return fmt.Sprintf("export V%d=%d", r.Intn(3), r.Intn(4)) }},
	{2, func(r *rand.Rand) string { return fmt.Sprintf("W%d=%d", r.Intn(3), r.Intn(4)) }},
	{2, func(r *rand.Rand) string { return fmt.Sprintf("unset V%d W%d", r.Intn(3), r.Intn(3)) }},
	{2, func(r *rand.Rand) string { return fmt.Sprintf("alias a%d='echo %d'", r.Intn(2), r.Intn(3)) }},
	{1, func(r *rand.Rand) string { return fmt.Sprintf("unalias a%d 2>/dev/null", r.Intn(2)) }},
	{2, func(r *rand.Rand) string { return fmt.Sprintf("fn%d() { echo %d; }", r.Intn(2), r.Intn(3)) }},
	{1, func(r *rand.Rand) string {
		return pick(r, []string{"set -o noglob", "set +o noglob", "set -u", "set +u"})
	}},
	{2, func(r *rand.Rand) string {
		return pick(r, []string{"trap 'echo t' USR1", "trap - USR1", "trap 'echo h' HUP"})
	}},
	{2, func(r *rand.Rand) string { return fmt.Sprintf("umask %03o", r.Intn(0o100)) }},
	{1, func(r *rand.Rand) string { return fmt.Sprintf("ulimit -S -n %d", 256+r.Intn(700)) }},
	// Descriptors of the shell: open, dup, read and write through, close.
	{3, func(r *rand.Rand) string { return fmt.Sprintf("exec 3>>%s", pick(r, fuzzFiles)) }},
	{3, func(r *rand.Rand) string { return fmt.Sprintf("exec 4<%s 2>/dev/null", pick(r, fuzzFiles)) }},
	{2, func(r *rand.Rand) string { return "exec 5>&3 2>/dev/null" }},
	{2, func(r *rand.Rand) string { return "echo w >&3 2>/dev/null" }},
	{3, func(r *rand.Rand) string { return "head -c 1 <&4 >/dev/null 2>&1" }},
	{2, func(r *rand.Rand) string { return fmt.Sprintf("exec %d>&- 2>/dev/null", 3+r.Intn(3)) }},
	// Processes: start, signal, stop, continue, end.
	{2, func(r *rand.Rand) string { return "sleep 1000 </dev/null >/dev/null 2>&1 &" }},
	{1, func(r *rand.Rand) string {
		// A writer that is done before the turn ends: one still running
		// would write on in the live env and in the branch, and their
		// probes, taken at different times, would differ.
		return fmt.Sprintf("(for i in 1 2 3; do sleep 0.05; echo x >> /tmp/bg%d; done) </dev/null >/dev/null 2>&1 & sleep 0.4", r.Intn(2))
	}},
	{2, func(r *rand.Rand) string {
		return fmt.Sprintf("kill -%s %%%d 2>/dev/null", pick(r, []string{"STOP", "CONT", "USR1"}), 1+r.Intn(2))
	}},
	{1, func(r *rand.Rand) string {
		n := 1 + r.Intn(2)
		return fmt.Sprintf("kill -KILL %%%d 2>/dev/null; wait %%%d 2>/dev/null", n, n)
	}},
	{1, func(r *rand.Rand) string { return "sleep 0.1" }},
	// Other names of the same file: a cleaned "..", a symlinked directory
	// (absolute, to be resolved inside the sandbox), a hard link replaced
	// by a copy; a directory renamed or removed under what a process
	// holds (a descriptor or its cwd).
	{2, func(r *rand.Rand) string {
		return fmt.Sprintf("mkdir -p /work/d0 && echo %d > /work/d0/../f%d", r.Intn(5), r.Intn(3))
	}},
	{2, func(r *rand.Rand) string {
		return fmt.Sprintf("ln -sfn %s /work/L && echo %d > /work/L/h 2>/dev/null", pick(r, fuzzDirs), r.Intn(5))
	}},
	{1, func(r *rand.Rand) string {
		return fmt.Sprintf("cp -p /work/f%d /work/t 2>/dev/null && mv -f /work/t /work/f%d", r.Intn(3), r.Intn(3))
	}},
	// Only the daemon goes to the background: "a && b &" runs the whole
	// list there, and a write in it can fall after the checkpoint (the
	// restored copy then makes it again, a second later: a probe
	// artifact the 5,000-turn run reported as a miss).
	{2, func(r *rand.Rand) string {
		d := pick(r, fuzzDirs)
		return fmt.Sprintf("mkdir -p %s && echo h >> %s/h && { sleep 1000 3<%s/h </dev/null >/dev/null 2>&1 & }", d, d, d)
	}},
	{1, func(r *rand.Rand) string {
		// The same directory for both: a job that fails at once (cd to a
		// missing one) ends after the turn, and the live env and the
		// branch report it at different moments.
		d := pick(r, fuzzDirs)
		return fmt.Sprintf("mkdir -p %s && { (cd %s && exec sleep 1000) </dev/null >/dev/null 2>&1 & }", d, d)
	}},
	// The shell holds a directory that the rmdir and mkdir productions may
	// then remove and make anew: a descriptor of a deleted directory.
	{1, func(r *rand.Rand) string {
		d := pick(r, fuzzDirs)
		return fmt.Sprintf("mkdir -p %s && exec 5<%s", d, d)
	}},
	{2, func(r *rand.Rand) string {
		a, b := pick(r, fuzzDirs), pick(r, fuzzDirs)
		return fmt.Sprintf("rm -rf %s.x; mv %s %s.x 2>/dev/null && mv %s.x %s 2>/dev/null", b, a, b, b, b)
	}},
	{1, func(r *rand.Rand) string { return "rm -rf " + pick(r, fuzzDirs) }},
	// What another process changes in an idle one: nice, oom_score_adj,
	// and the shell's hard limits.
	{1, func(r *rand.Rand) string { return fmt.Sprintf("renice -n %d -p $! >/dev/null 2>&1", r.Intn(10)) }},
	{1, func(r *rand.Rand) string {
		return fmt.Sprintf("echo %d > /proc/$!/oom_score_adj 2>/dev/null", r.Intn(500))
	}},
	{1, func(r *rand.Rand) string {
		return fmt.Sprintf("ulimit -S -c 0; ulimit -H -c %d 2>/dev/null", 1000+r.Intn(9000))
	}},
	// Kernel state outside files (docs/inspector.md, "Syscall classes"):
	// another process's affinity, I/O priority and timer slack, which
	// CRIU does not restore (Arbor re-applies them); a FIFO the shell
	// holds, written and read through its descriptor.
	{1, func(r *rand.Rand) string { return fmt.Sprintf("taskset -p %d $! >/dev/null 2>&1", 1+r.Intn(2)) }},
	{1, func(r *rand.Rand) string {
		return pick(r, []string{"ionice -c 3 -p $! 2>/dev/null", "ionice -c 2 -n 7 -p $! 2>/dev/null", "ionice -c 2 -n 1 -p $! 2>/dev/null"})
	}},
	{1, func(r *rand.Rand) string {
		return fmt.Sprintf("echo %d > /proc/$!/timerslack_ns 2>/dev/null", 50000+r.Intn(50000))
	}},
	{1, func(r *rand.Rand) string { return "mkfifo /work/q 2>/dev/null; exec 6<>/work/q" }},
	{1, func(r *rand.Rand) string { return fmt.Sprintf("[ -e /proc/$$/fd/6 ] && echo q%d >&6", r.Intn(9)) }},
	{1, func(r *rand.Rand) string { return "[ -e /proc/$$/fd/6 ] && read -t 0.1 -u 6 FQ; true" }},
}

// bashGrammar is added in bash (the debian image): arrays and attributes,
// the directory stack, shopt.
var bashGrammar = []turnGen{
	{2, func(r *rand.Rand) string { return fmt.Sprintf("declare -a A%d=(%d x 'y z')", r.Intn(2), r.Intn(3)) }},
	{1, func(r *rand.Rand) string { return fmt.Sprintf("A%d+=(%d)", r.Intn(2), r.Intn(3)) }},
	{1, func(r *rand.Rand) string { return fmt.Sprintf("declare -A M=([k%d]=%d)", r.Intn(2), r.Intn(3)) }},
	{1, func(r *rand.Rand) string { return fmt.Sprintf("declare -i I%d=%d", r.Intn(2), r.Intn(9)) }},
	{1, func(r *rand.Rand) string { return fmt.Sprintf("export -n V%d 2>/dev/null", r.Intn(3)) }},
	{2, func(r *rand.Rand) string { return "pushd " + pick(r, []string{"/tmp", "/work", "/"}) + " >/dev/null" }},
	{1, func(r *rand.Rand) string { return "popd >/dev/null 2>&1" }},
	{1, func(r *rand.Rand) string {
		return pick(r, []string{"shopt -s extglob", "shopt -u extglob", "set -o pipefail", "set +o pipefail"})
	}},
	// A child takes or drops a lock on a file the shell holds open.
	{1, func(r *rand.Rand) string { return "exec 9>>/work/lock" }},
	{1, func(r *rand.Rand) string {
		return pick(r, []string{"flock -n 9 2>/dev/null", "flock -u 9 2>/dev/null", "flock -s -n 9 2>/dev/null"})
	}},
	{1, func(r *rand.Rand) string {
		return fmt.Sprintf("prlimit --pid $! --nofile=%d:%d >/dev/null 2>&1", 100+r.Intn(100), 300+r.Intn(100))
	}},
	// System V IPC objects (util-linux's ipcmk and ipcrm).
	{1, func(r *rand.Rand) string {
		return pick(r, []string{"ipcmk -Q >/dev/null 2>&1", "ipcmk -S 2 >/dev/null 2>&1", "ipcmk -M 4096 >/dev/null 2>&1"})
	}},
	{1, func(r *rand.Rand) string { return "ipcrm -a >/dev/null 2>&1; true" }},
}

// skipRegressions are turn sequences that were missed once (by the
// product, or that found a flaw in the probe); every run checks them
// first, on busybox.
var skipRegressions = [][]string{
	// Issue 13's examples: the shell opens a descriptor (a restore of the
	// old process image had no fd 3), and a metadata-only change (a
	// restore brought back the old mtime).
	{"exec 3>>/work/log", "echo x >&3", "true"},
	{"echo a > /work/m", "touch -d '2001-02-03 04:05:06' /work/m"},
	// A child moves the offset of the shell's descriptor, and nothing else.
	{"echo abcdef > /work/r", "exec 4</work/r", "head -c 2 <&4 >/dev/null"},
	// A signal stops an idle process: only its state changes.
	{"sleep 1000 </dev/null >/dev/null 2>&1 &", "kill -STOP %1", "kill -CONT %1"},
	// A file the shell holds open changes size: the old process image
	// cannot be restored next to it (CRIU: "File work/f0 has bad size").
	{"echo x > /work/f0", "exec 4</work/f0", ": > /work/f0", "true"},
	// The shell holds a removed file that another name still links: CRIU
	// refused the dump (link remap) and a later removal of the other name
	// left the image naming a file the snapshot no longer had.
	{"echo 0 > /tmp/t0", "exec 3>>/tmp/t0", "ln -f /tmp/t0 /work/f2", "rm -f /tmp/t0", "echo w >&3", "rm -f /work/f2", "true"},
	// The shell holds one removed directory twice (a descriptor and its
	// cwd) with a new directory at its path: the restore swapped the
	// ghost in twice and failed.
	{"mkdir -p /work/d1 && exec 5</work/d1", "cd /work/d1", "rmdir /work/d1", "mkdir -p /work/d1", "exec 3>&- 2>/dev/null"},
	// A descriptor of a deleted file: CRIU restores it through a
	// temporary link, so its name reads "f1.cr_link (deleted)".
	{"exec 3>>/work/f1", "rm -f /work/f1", "echo 0 > /work/f1", "chown 1:0 /work/f2"},
	// The probe once saw the restored terminal's O_LARGEFILE, and once
	// ran with globbing off.
	{"set -o noglob", "true"},
	// From a review of the inspector (written by hand): a held file
	// changed by another name (a hard link, a cleaned ".."), a directory
	// renamed under a file a process holds, a hard link replaced by a
	// copy (only the link count tells), and what another process changes
	// in an idle one or in the shell (nice, oom_score_adj, hard limits).
	{"echo x > /work/f0", "ln -f /work/f0 /work/f1", "exec 4</work/f0", ": > /work/f1", "true"},
	{"mkdir -p /work/d0", "echo x > /work/f0", "exec 4</work/f0", "echo yy > /work/d0/../f0", "true"},
	{"mkdir -p /work/d0", "echo h > /work/d0/h", "sleep 1000 3</work/d0/h </dev/null >/dev/null 2>&1 &", "mv /work/d0 /work/d1", "true"},
	{"echo a > /work/f0", "ln -f /work/f0 /work/f1", "cp -p /work/f1 /work/t && mv -f /work/t /work/f1"},
	{"sleep 1000 </dev/null >/dev/null 2>&1 &", "renice -n 5 -p $! >/dev/null", "echo 100 > /proc/$!/oom_score_adj"},
	{"ulimit -S -c 1000", "ulimit -H -c 5000", "true"},
	// The 5,000-turn run: a daemon's cwd removed and a new directory made
	// at its path; CRIU's restore took the new directory away (from any
	// checkpoint) until Restore moved it aside (cr/criu/ghostdir_linux.go).
	{"mkdir -p /work/d0 && { (cd /work/d0 && exec sleep 1000) </dev/null >/dev/null 2>&1 & }", "rmdir /work/d0", "mkdir /work/d0", "true"},
	{"mkdir -p /work/d0 && exec 5</work/d0", "rmdir /work/d0 && mkdir /work/d0 && echo x > /work/d0/f", "true"},
	// The next 5,000-turn run: a file in the new directory held by
	// another process (the restore moved the new directory aside, and that
	// process's file could not be opened).
	{"mkdir -p /work/d1 && { (cd /work/d1 && exec sleep 1000) </dev/null >/dev/null 2>&1 & }", "rmdir /work/d1 2>/dev/null",
		"mkdir -p /work/d0 && echo h >> /work/d0/h && { sleep 1000 3</work/d0/h </dev/null >/dev/null 2>&1 & }",
		"rm -rf /work/d1.x; mv /work/d0 /work/d1.x 2>/dev/null && mv /work/d1.x /work/d1 2>/dev/null", "W1=2"},
	// The run after that: the shell's cwd removed with a file a daemon
	// holds in it; CRIU removed the directory's ghost before the file's
	// and failed the restore (from any checkpoint).
	{"mkdir -p /work/d0 && echo h >> /work/d0/h && { sleep 1000 3</work/d0/h </dev/null >/dev/null 2>&1 & }", "cd /work/d0 2>/dev/null", "rm -rf /work/d0", "true"},
}

// nextTurn draws a turn from the grammar (with bash's when bash).
func nextTurn(r *rand.Rand, bash bool) string {
	g := turnGrammar
	if bash {
		g = append(slices.Clone(turnGrammar), bashGrammar...)
	}
	total := 0
	for _, t := range g {
		total += t.weight
	}
	n := r.Intn(total)
	for _, t := range g {
		if n < t.weight {
			return t.make(r)
		}
		n -= t.weight
	}
	panic("unreachable")
}

// skipProbe prints what a restore brings back. The parts that must be the
// shell's own (traps, jobs) run in it; the rest in a subshell, so that the
// probe's variables, its cwd and its options (globbing back on, unset
// variables allowed, whatever the turns set) do not last. Only processes
// started before the probe are listed, without their pids' start times
// (a restore starts them anew).
const skipProbe = `trap; jobs -l; set -o; [ -n "${BASH_VERSION-}" ] && { shopt -p; dirs -l -p; declare -p | grep -v -E '^declare -[-a-zA-Z]+ (BASHPID|BASH_COMMAND|BASH_LINENO|BASH_SOURCE|FUNCNAME|PIPESTATUS|HISTCMD|BASH_ARGC|BASH_ARGV|BASH_ARGV0|LINENO|RANDOM|SRANDOM|SECONDS|EPOCHSECONDS|EPOCHREALTIME|_|__arbor_cmd|COLUMNS|LINES)(=|$)'; declare -f; }; (
set +f +u
echo "cwd=$PWD"; umask; ulimit -a; ulimit -H -a | sed 's/^/hard /'; alias; set | grep -v -E '^(_|LINENO|RANDOM|SRANDOM|SECONDS|EPOCHSECONDS|EPOCHREALTIME|BASHPID|BASH_COMMAND|BASH_LINENO|BASH_SOURCE|FUNCNAME|PIPESTATUS|HISTCMD|BASH_ARGC|BASH_ARGV|BASH_ARGV0|OPTIND|PPID|COLUMNS|LINES|BASH_SUBSHELL)='
cd /
for fd in /proc/$$/fd/*; do n=${fd##*/}
  fl=$(sed -n 's/^flags:[[:space:]]*//p' /proc/$$/fdinfo/$n); fl=$(printf %o $((0$fl & ~0100000)))
  lk=$(sed -n 's/^lock:[[:space:]]*[0-9]*:[[:space:]]*//p' /proc/$$/fdinfo/$n | awk '{print $1, $2, $3, $6, $7}' | tr '\n' ';')
  echo "fd $n $(readlink $fd | sed -e 's/:\[[0-9]*\]$//' -e 's/\.cr_link (deleted)$/ (deleted)/') flags=$fl $(grep '^pos' /proc/$$/fdinfo/$n | tr '\t' ' ') locks=$lk"
done
find /work /tmp -xdev 2>/dev/null | sort | while read -r p; do
  if [ -d "$p" ] && [ ! -L "$p" ]; then st=$(stat -c '%F %a %u:%g size=%s links=%h' "$p")
  else st=$(stat -c '%F %a %u:%g size=%s mtime=%Y links=%h' "$p"); fi
  if [ -f "$p" ] && [ ! -L "$p" ]; then st="$st $(md5sum < "$p" | cut -c1-32)"; fi
  if [ -L "$p" ]; then st="$st -> $(readlink "$p")"; fi
  echo "file $p $st"
done
mypid=$(cut -d' ' -f4 /proc/self/stat)
me=$(cut -d' ' -f22 /proc/$mypid/stat)
for d in /proc/[0-9]*; do
  s=$(cut -d' ' -f22 $d/stat 2>/dev/null) || continue
  [ -n "$s" ] && [ "$s" -le "$me" ] && [ "${d#/proc/}" != "$mypid" ] || continue
  sig=""
  # Init is a Go program: the runtime preempts its threads with SIGURG,
  # pending for an instant now and then, not state a restore keeps.
  m=0x40000; [ "${d#/proc/}" = 1 ] && m=$((m | 0x400000))
  for k in SigPnd ShdPnd SigBlk SigCgt; do
    v=$(sed -n "s/^$k:[[:space:]]*//p" $d/status)
    case $k in *Pnd) v=$(printf %x $((0x$v & ~m)));; esac
    sig="$sig $k=$v"
  done
  st=$(cut -d' ' -f3 $d/stat); case $st in [RSDI]) st=live;; esac
  echo "proc ${d#/proc/} $st $(tr '\0' ' ' < $d/cmdline)$sig nice=$(sed 's/.*) //' $d/stat | cut -d' ' -f17) oom=$(cat $d/oom_score_adj) cwd=$(readlink $d/cwd) cpus=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' $d/status) io=$(ionice -p ${d#/proc/} 2>/dev/null) slack=$(cat $d/timerslack_ns 2>/dev/null)"
done
for k in msg sem shm; do awk -v k=$k 'NR > 1 { print "ipc", k, $1, $2, $3, $4, (k == "msg" ? $5 : "") }' /proc/sysvipc/$k 2>/dev/null; done
)`

type skipMiss struct {
	Turns []string // from a fresh env, the last is the one classified wrongly
	Kind  state.Kind
	Diff  string // the probe's, "" when only the CRIU oracle saw a difference
	// CRIUDiff is the CRIU oracle's: the fields of the two trees' images
	// that differ (cr/imgcompare); "" when it saw none or did not run.
	CRIUDiff string
}

// oracles says which oracles saw the miss.
func (m *skipMiss) oracles() string {
	switch {
	case m.Diff != "" && m.CRIUDiff != "":
		return "probe and CRIU"
	case m.CRIUDiff != "":
		return "CRIU only"
	}
	return "probe only"
}

// fuzzRun is one run of the fuzzer: sequences of turns, each on a fresh
// env, until the budget is spent.
type fuzzRun struct {
	t      *testing.T
	r      *branchtest.Rig
	img    string
	turns  int
	checks int // turns whose skip was checked against a branch
	deltas int // proc and full checkpoints recorded as a shell delta
	kinds  map[state.Kind]int
	misses []skipMiss
	// criuEvery runs the CRIU oracle on every criuEvery-th checked turn
	// (0: never); criuChecks counts them.
	criuEvery, criuChecks int
	// unchanged counts the turns after which the probe read the live env
	// as before the turn; falsePos those of them that took a checkpoint.
	// The probe does not read process memory or atimes, so falsePos is an
	// upper bound on the checkpoints taken for nothing.
	unchanged, falsePos int
}

func TestSkipsAreSound(t *testing.T) {
	r := branchtest.ForTest(t, branchtest.Options{Inspector: true})
	if !r.Inspector.UsesBPF() {
		t.Log("eBPF unavailable: fuzzing the fallback inspector")
	}
	seed := time.Now().UnixNano()
	if v := os.Getenv("ARBOR_SKIPFUZZ_SEED"); v != "" {
		seed, _ = strconv.ParseInt(v, 10, 64)
	}
	budget := 60
	if v := os.Getenv("ARBOR_SKIPFUZZ_TURNS"); v != "" {
		budget, _ = strconv.Atoi(v)
	}
	var until time.Time
	if v := os.Getenv("ARBOR_SKIPFUZZ_FOR"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("ARBOR_SKIPFUZZ_FOR=%q: %v", v, err)
		}
		until, budget = time.Now().Add(d), 1<<30
	}
	img := os.Getenv("ARBOR_SKIPFUZZ_IMAGE")
	if img == "" {
		img = "busybox"
	}
	t.Logf("seed %d (ARBOR_SKIPFUZZ_SEED replays it), image %s", seed, img)
	// The CRIU oracle costs about a second per checked turn (two dumps,
	// memory included): make test runs it on every third.
	criuEvery := 3
	if v := os.Getenv("ARBOR_SKIPFUZZ_CRIU_EVERY"); v != "" {
		criuEvery, _ = strconv.Atoi(v)
	}
	rng := rand.New(rand.NewSource(seed))
	f := &fuzzRun{t: t, r: r, img: img, kinds: map[state.Kind]int{}, criuEvery: criuEvery}
	start := time.Now()
	if v := os.Getenv("ARBOR_SKIPFUZZ_REPLAY"); v != "" {
		// One sequence, its turns one a line: a miss's, or a guess.
		budget = 0
		if m := f.sequence(strings.Split(strings.TrimSpace(v), "\n"), true); m != nil {
			f.misses = append(f.misses, *m)
			t.Errorf("replay: turn %q classified %s, but a branch of its state differs from the live env (%s):\n%s%s", m.Turns[len(m.Turns)-1], m.Kind, m.oracles(), m.Diff, m.criuText())
		}
	} else if img == "busybox" {
		for _, seq := range skipRegressions {
			if m := f.sequence(seq, true); m != nil {
				f.misses = append(f.misses, *m)
				t.Errorf("regression: turn %q classified %s, but a branch of its state differs from the live env (%s):\n%s%s", m.Turns[len(m.Turns)-1], m.Kind, m.oracles(), m.Diff, m.criuText())
			}
		}
	}
	for f.turns < budget && (until.IsZero() || time.Now().Before(until)) {
		n := 10 + rng.Intn(20)
		seq := make([]string, n)
		for i := range seq {
			seq[i] = nextTurn(rng, img != "busybox")
		}
		if m := f.sequence(seq, true); m != nil {
			m = f.shrink(*m)
			f.misses = append(f.misses, *m)
			t.Errorf("miss: turn %q classified %s, but a branch of its state differs from the live env (%s):\n%s%s\nreproduce with these turns from a fresh %s env:\n  %s",
				m.Turns[len(m.Turns)-1], m.Kind, m.oracles(), m.Diff, m.criuText(), img, strings.Join(m.Turns, "\n  "))
		}
	}
	skipped := f.kinds[state.None] + f.kinds[state.FS] + f.kinds[state.Proc]
	byOracle := map[string]int{}
	for _, m := range f.misses {
		byOracle[m.oracles()]++
	}
	report := fmt.Sprintf("skip fuzzer: image %s, seed %d, %d turns in %v, %d checked against a branch (%d also by the CRIU oracle, every %d), %d misses (probe only %d, CRIU only %d, both %d); checkpoints: none %d, fs %d, proc %d, full %d (%.0f%% skipped a part; %d shell deltas instead of a dump); false positives: %d of the %d turns the probe saw change nothing took a checkpoint (%.0f%%, an upper bound: the probe reads no process memory)\n",
		img, seed, f.turns, time.Since(start).Round(time.Second), f.checks, f.criuChecks, f.criuEvery, len(f.misses),
		byOracle["probe only"], byOracle["CRIU only"], byOracle["probe and CRIU"],
		f.kinds[state.None], f.kinds[state.FS], f.kinds[state.Proc], f.kinds[state.Full], 100*float64(skipped)/float64(max(f.turns, 1)), f.deltas,
		f.falsePos, f.unchanged, 100*float64(f.falsePos)/float64(max(f.unchanged, 1)))
	for i, m := range f.misses {
		report += fmt.Sprintf("\nmiss %d (%s, seen by %s):\n  turns:\n    %s\n  probe diff:\n%s\n  CRIU oracle diff:\n%s\n", i+1, m.Kind, m.oracles(), strings.Join(m.Turns, "\n    "), m.Diff, m.CRIUDiff)
	}
	t.Log(report)
	if p := os.Getenv("ARBOR_SKIPFUZZ_REPORT"); p != "" {
		if err := os.WriteFile(p, []byte(report), 0o644); err != nil {
			t.Error(err)
		}
	}
	if f.checks == 0 {
		t.Error("no turn was checked: the grammar produced only full checkpoints")
	}
}

// sequence runs turns on a fresh env and checks every skip (only the last
// turn's while shrinking); it returns the first miss (the turns up to it).
// count adds the turns to the run's figures (not while shrinking).
func (f *fuzzRun) sequence(turns []string, count bool) *skipMiss {
	t, e := f.t, f.r.Engine
	ctx := context.Background()
	env, _, err := e.NewEnv(ctx, f.img)
	if err != nil {
		t.Fatal(err)
	}
	defer e.CloseEnv(ctx, env)
	if _, err := e.Exec(ctx, env, "mkdir -p /work && cd /work", sandbox.ExecOptions{Timeout: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Checkpoint(ctx, env, state.Full); err != nil {
		t.Fatal(err)
	}
	// Counting, every turn's live state is probed (for the false
	// positives); shrinking, only the last turn's, in compare.
	var prev []string
	if count {
		prev = f.probe(ctx, env)
	}
	for i, cmd := range turns {
		if _, err := e.Exec(ctx, env, cmd, sandbox.ExecOptions{Timeout: 10 * time.Second}); err != nil {
			t.Fatalf("turn %q: %v", cmd, err)
		}
		turn, err := e.Classify(ctx, env, cmd)
		if err != nil {
			t.Fatalf("classify %q: %v", cmd, err)
		}
		sid, kind, err := e.CheckpointAsync(env, turn.Kind)
		if err != nil {
			t.Fatalf("checkpoint %q: %v", cmd, err)
		}
		// As the server does before a branch of a fresh state id: wait
		// for its checkpoint to commit.
		if _, err := e.WaitCheckpoint(ctx, env); err != nil {
			t.Fatalf("checkpoint %q: %v", cmd, err)
		}
		// A background checkpoint that failed leaves its state id unmade
		// (WaitCheckpoint does not say; the server reports it on the next
		// step): say why, with the turns, rather than branch a state that
		// never came to be (the "unknown state" two long runs ended on).
		if err := env.TakeCheckpointError(); err != nil {
			t.Fatalf("the checkpoint of turn %q (%s, state %s) failed: %v\nturns from a fresh %s env:\n  %s",
				cmd, kind, sid, err, f.img, strings.Join(turns[:i+1], "\n  "))
		}
		var live []string
		if count {
			f.turns++
			f.kinds[kind]++
			live = f.probe(ctx, env)
			if slices.Equal(live, prev) {
				f.unchanged++
				if kind != state.None {
					f.falsePos++
				}
			}
			prev = live
		}
		// A shell delta stands for a process image: check it, in a full
		// checkpoint too.
		delta := false
		if kind == state.Proc || kind == state.Full {
			if st, err := e.State(sid); err == nil && !st.Dumped() {
				delta = true
			}
		}
		if delta && count {
			f.deltas++
		}
		if (kind == state.Full && !delta) || (!count && i < len(turns)-1) {
			continue // everything was taken, or shrinking: only the last turn counts
		}
		if count {
			f.checks++
		}
		// The CRIU oracle on every criuEvery-th checked turn, and on
		// every replay while shrinking (the miss may be its alone).
		withCRIU := f.criuEvery > 0 && (!count || f.checks%f.criuEvery == 0)
		if withCRIU && count {
			f.criuChecks++
		}
		if diff, cdiff := f.compare(ctx, env, sid, live, withCRIU); diff != "" || cdiff != "" {
			return &skipMiss{Turns: append([]string(nil), turns[:i+1]...), Kind: kind, Diff: diff, CRIUDiff: cdiff}
		}
	}
	return nil
}

// probe runs skipProbe in env and returns its lines.
func (f *fuzzRun) probe(ctx context.Context, en *branch.Env) []string {
	t := f.t
	r, err := f.r.Engine.Exec(ctx, en, skipProbe, sandbox.ExecOptions{Timeout: 20 * time.Second, MaxOutput: 1 << 20})
	if err != nil {
		t.Fatalf("probe: %v", err)
	}
	if r.Truncated {
		t.Fatal("probe output truncated")
	}
	lines := strings.Split(strings.TrimSpace(string(r.Stdout)), "\n")
	// The probe must see what it compares: init among the processes,
	// the shell's descriptors, /work.
	for _, want := range []string{"proc 1 ", "fd 0 ", "file /work "} {
		if !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, want) }) {
			t.Fatalf("probe output lacks a %q line:\n%s", want, r.Stdout)
		}
	}
	return lines
}

// compare probes a branch of sid and returns how it differs from live,
// the probe of env (probed here when nil), and, withCRIU, how the two
// trees' CRIU images differ.
func (f *fuzzRun) compare(ctx context.Context, env *branch.Env, sid string, live []string, withCRIU bool) (diff, criuDiff string) {
	t, e := f.t, f.r.Engine
	res, err := e.Branch(ctx, branch.Source{State: sid}, 1)
	if err == nil {
		err = res.Errors[0]
	}
	if errors.Is(err, state.ErrRestore) {
		// The state does not restore: a skip paired artifacts that
		// cannot go together (CRIU: "File ... has bad size").
		return "    the branch does not restore: " + strings.ReplaceAll(err.Error(), "\n", "\n    "), ""
	}
	if err != nil {
		// Not a miss: the engine lost a state its open env made. Say
		// what it still has, to tell GC from the checkpoint path.
		var have []string
		states, serr := e.States(env.ID)
		for _, s := range states {
			have = append(have, s.ID+"("+string(s.Kind)+")")
		}
		u, _ := e.Usage()
		t.Fatalf("branch of %s: %v\nenv %s head %s, its states %v (%v)\nGC %+v", sid, err, env.ID, env.Head(), have, serr, u.GC)
	}
	child := res.Children[0]
	defer e.CloseEnv(ctx, child)
	if live == nil {
		live = f.probe(ctx, env)
	}
	restored := f.probe(ctx, child)
	// As multisets: a line twice in one and once in the other differs.
	count := map[string]int{}
	for _, l := range live {
		count[l]++
	}
	for _, l := range restored {
		count[l]--
	}
	var lines []string
	for _, l := range live {
		if count[l] > 0 {
			lines = append(lines, "    live only:     "+l)
			count[l]--
		}
	}
	for _, l := range restored {
		if count[l] < 0 {
			lines = append(lines, "    restored only: "+l)
			count[l]++
		}
	}
	// The second oracle, after the probe (which ran in both trees, the
	// same script): the images CRIU dumps of each, compared field by
	// field.
	if withCRIU {
		criuDiff = diffText(criuOracle(ctx, t, e, env, child))
	}
	return strings.Join(lines, "\n"), criuDiff
}

// criuText is the CRIU oracle's diff for a log, cut to its first lines.
func (m *skipMiss) criuText() string {
	if m.CRIUDiff == "" {
		return ""
	}
	lines := strings.Split(strings.TrimRight(m.CRIUDiff, "\n"), "\n")
	const most = 40
	head := "  the CRIU oracle (live != restored):\n"
	if len(lines) > most {
		return head + strings.Join(lines[:most], "\n") + fmt.Sprintf("\n    ... %d more\n", len(lines)-most)
	}
	return head + strings.Join(lines, "\n") + "\n"
}

// shrink drops the turns before the missed one that the miss does not need
// (one pass, each replayed on a fresh env), so that the report names a
// short sequence.
func (f *fuzzRun) shrink(m skipMiss) *skipMiss {
	best := m
	deadline := time.Now().Add(2 * time.Minute)
	for i := len(best.Turns) - 2; i >= 0 && time.Now().Before(deadline); i-- {
		try := append(append([]string(nil), best.Turns[:i]...), best.Turns[i+1:]...)
		if got := f.sequence(try, false); got != nil && got.Turns[len(got.Turns)-1] == best.Turns[len(best.Turns)-1] {
			best = *got
		}
	}
	return &best
}
