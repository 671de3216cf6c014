# Arbor shipped-task grading library: the hidden helpers every check uses.
#
# It runs in the trusted grader (docs/tasks.md): as the sandbox's root, from
# the pristine post-setup image, with only the agent's outputs copied in and
# this directory at /grader (root-only). The agent's code (its Python
# modules, C programs, shell scripts, nginx configuration) only ever runs in
# children as nobody (uid/gid 65534), stdin from /dev/null or a file, output
# to a capped file, under a timeout, with a minimal environment; whatever
# those children print is data the check compares with expected answers
# held here, never a verdict. The verdict is the check's own exit status or
# its own last stdout line.
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

NOBODY = 65534
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": "/nonexistent"}
OUTPUT_CAP = 4 << 20


def log(*a):
    """Diagnostics go to stderr: stdout's last line is the verdict."""
    print(*a, file=sys.stderr, flush=True)


def kill_nobody():
    """Kills every process of nobody (what a child left behind), until none is left."""
    for _ in range(50):
        found = False
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                if os.stat("/proc/" + pid).st_uid == NOBODY:
                    os.kill(int(pid), signal.SIGKILL)
                    found = True
            except OSError:
                pass
        if not found:
            return
        time.sleep(0.02)


def _limits():
    resource.setrlimit(resource.RLIMIT_FSIZE, (OUTPUT_CAP * 4, OUTPUT_CAP * 4))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def run(argv, cwd="/", timeout=30, stdin=None, env=None):
    """Runs argv as nobody. stdin is bytes, str or None (/dev/null).
    Returns (exit code, or None on a timeout; stdout; stderr) as text."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as inp:
        if stdin is not None:
            inp.write(stdin.encode() if isinstance(stdin, str) else stdin)
            inp.seek(0)
        try:
            p = subprocess.Popen(argv, cwd=cwd, env=env or ENV, user=NOBODY, group=NOBODY, extra_groups=[],
                                 stdin=inp if stdin is not None else subprocess.DEVNULL, stdout=out, stderr=err,
                                 start_new_session=True, preexec_fn=_limits)
        except OSError as e:
            return 127, "", str(e)
        try:
            code = p.wait(timeout)
        except subprocess.TimeoutExpired:
            code = None
        kill_nobody()
        p.wait()
        out.seek(0)
        err.seek(0)
        return code, out.read(OUTPUT_CAP).decode(errors="replace"), err.read(OUTPUT_CAP).decode(errors="replace")


def scratch():
    """A fresh directory nobody may write in."""
    d = tempfile.mkdtemp(prefix="grade-")
    os.chmod(d, 0o755)
    os.chown(d, NOBODY, NOBODY)
    return d


def copy_project(src):
    """Copies the agent's project into a scratch directory, as nobody (so
    nothing it links to that nobody cannot read comes along)."""
    d = scratch()
    code, _, err = run(["cp", "-R", src + "/.", d])
    if code != 0:
        log("copying", src, "failed:", err[-300:])
    return d


def place(path, d, name=None):
    """Copies a hidden file into scratch directory d for nobody to read."""
    dst = os.path.join(d, name or os.path.basename(path))
    if os.path.lexists(dst):
        os.unlink(dst)
    shutil.copyfile(path, dst, follow_symlinks=False)
    os.chmod(dst, 0o644)
    return dst


def make(d, target=None, timeout=120):
    """Runs make in d as nobody; True when it succeeded."""
    argv = ["make", "-C", d] + ([target] if target else [])
    code, out, err = run(argv, cwd=d, timeout=timeout)
    if code != 0:
        log("make failed (exit %s):" % code, (out + err)[-1500:])
    return code == 0


def cc(d, out, sources, flags=(), timeout=120):
    """Compiles sources (paths relative to d) to d/out as nobody."""
    code, o, e = run(["gcc", "-std=c11", "-O1", "-w", "-o", out] + list(sources) + list(flags), cwd=d, timeout=timeout)
    if code != 0:
        log("compiling the test driver failed:", (o + e)[-1500:])
    return code == 0


_PYCHILD = r"""
import json, os, signal, sys
res = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.path.insert(0, sys.argv[1])
cases = json.loads(sys.stdin.read())
def alarm(*_):
    raise TimeoutError("case timed out")
signal.signal(signal.SIGALRM, alarm)
out = []
for code in cases:
    ns = {}
    try:
        signal.alarm(5)
        exec(code, ns)
        signal.alarm(0)
        v = ns.get("result")
        json.dumps(v)
        out.append(["ok", v])
    except BaseException as e:
        signal.alarm(0)
        out.append(["raise", type(e).__name__])
res.write("\n" + json.dumps(out) + "\n")
res.flush()
os._exit(0)
"""


def py_results(project, snippets, timeout=60):
    """Runs each snippet (Python code that sets `result`) with project on
    sys.path, in one child as nobody; returns one [kind, value] a snippet
    (kind "ok", or "raise" with the exception's class name), or None for
    each when the child gave no answer."""
    code, out, err = run([sys.executable, "-I", "-B", "-c", _PYCHILD, project], cwd=project, timeout=timeout,
                         stdin=json.dumps(snippets))
    lines = out.strip().splitlines()
    try:
        got = json.loads(lines[-1])
        if isinstance(got, list) and len(got) == len(snippets):
            return got
    except (IndexError, ValueError):
        pass
    log("no answers from the project (exit %s); its stderr:" % code, err[-1500:])
    return [None] * len(snippets)


def ok(v):
    """The expected answer of a snippet that returns v."""
    return ["ok", json.loads(json.dumps(v))]


def raises(name):
    """The expected answer of a snippet that raises exception class name."""
    return ["raise", name]


def score(results, names=None):
    """Compares (got, want) pairs; returns the fraction right, logging the wrong ones."""
    good = 0
    for i, (got, want) in enumerate(results):
        if got == want:
            good += 1
        else:
            log("case %s: got %s, want %s" % (names[i] if names else i + 1, json.dumps(got)[:200], json.dumps(want)[:200]))
    return good / len(results) if results else 0.0


def check_py(project, cases, partial=False):
    """Runs cases, a list of (snippet, want), against project and ends the
    check: all right exits 0; with partial the fraction right is printed."""
    got = py_results(project, [c for c, _ in cases])
    finish(score(list(zip(got, [w for _, w in cases])), [c.strip().splitlines()[-1][:60] for c, _ in cases]), partial)


def finish(fraction, partial=False):
    """Ends the check: the fraction right as the last stdout line
    (partial credit), else exit 0 only when everything was right."""
    if partial:
        print("%.4f" % fraction)
        sys.exit(0)
    print("all right" if fraction == 1.0 else "%.0f%% right" % (100 * fraction))
    sys.exit(0 if fraction == 1.0 else 1)


def lines_by_key(out):
    """The "key: value" lines of a test driver's output, as a dict."""
    got = {}
    for line in out.splitlines():
        k, sep, v = line.partition(": ")
        if sep:
            got.setdefault(k, v)
    return got


def check_c(project, driver, link, expected, flags=("-Iinclude",), partial=False):
    """Builds the agent's C project with its Makefile and the hidden test
    driver (/grader/driver, linked with link, paths in the project) as
    nobody, runs the driver, and compares its "key: value" lines with
    expected ({key: value}); ends the check."""
    d = copy_project(project)
    if not make(d):
        finish(0.0, partial)
    place("/grader/" + driver, d, "arbor_driver.c")
    if not cc(d, "arbor_driver", ["arbor_driver.c"] + list(link), flags):
        finish(0.0, partial)
    code, out, err = run(["./arbor_driver"], cwd=d, timeout=30)
    if code != 0:
        log("the driver exited with %s: %s" % (code, err[-500:]))
    got = lines_by_key(out)
    keys = sorted(expected)
    finish(score([(got.get(k), expected[k]) for k in keys], keys), partial)
