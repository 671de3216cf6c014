"""Arbor as an OpenEnv sandbox backend (docs/openenv.md in the repository).

OpenEnv's harness layer drives sandboxes through a small protocol
(``SandboxBackend.create`` -> ``SandboxHandle`` with ``exec``, ``start_bg``,
``write_text``, ``read_text``, ``exists``, ``kill``; ``BgJob`` with ``pid``,
``wait``, ``kill``). ``ArborSandboxBackend`` satisfies it over protocol v1,
duck-typed: this module does not import OpenEnv, so it installs without it.
What Arbor adds: ``fork(n)`` (n live copies of the sandbox, processes
included) and ``rollback(state_id)``; every call that changed the sandbox
leaves a state id (``handle.state_id``) to roll back to or fork from.

    backend = ArborSandboxBackend("ws://127.0.0.1:7878/v1/ws", task="hello")
    sb = backend.create(envs={"MODE": "test"})
    r = sb.exec("ls", cwd="/work", timeout=30)        # ExecResult(exit_code, stdout, stderr, ...)
    job = sb.start_bg("python3 -m http.server 8000")
    a, b = sb.fork(2)                                  # two copies, the server running in each
    sb.kill(); a.kill(); b.kill()

Each ``exec`` runs its command with ``sh -c`` in a subshell of the env's
persistent shell: ``cwd`` and ``envs`` apply to that command only, and it
sees the shell's exported variables (not its functions), while the
variables given to ``create`` are exported in the shell once, for every
later command (and every fork). Errors of Arbor raise ``ArborError``
(``.infra`` for failures of Arbor itself); a command that fails is an
``ExecResult`` with its exit code, never an exception.
"""

import re
import shlex
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple, Union

from ._errors import ArborError
from ._sync import Client, Env

__all__ = ["ArborSandboxBackend", "ArborSandbox", "ArborBgJob", "ExecResult"]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Where background jobs keep their script, output and exit status, inside
# the sandbox.
_BG_DIR = "/tmp/.arbor-bg"
# read_text asks for the whole file up to the server's output ceiling.
_READ_MAX = 64 << 20
# exec(timeout=None): the server's longest command timeout.
_NO_TIMEOUT_S = 3600.0


@dataclass
class ExecResult:
    """Result of a command: OpenEnv's ExecResult (exit_code, stdout,
    stderr) plus what Arbor tells besides."""

    exit_code: int
    stdout: str
    stderr: str
    # The command was killed at its timeout.
    timed_out: bool = False
    # Output was cut to its head and tail (over 256 KiB a stream).
    truncated: bool = False
    # The state after the command (fork or roll back to it).
    state_id: Optional[str] = None


def _text(v: Any) -> str:
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).decode("utf-8", errors="replace")
    return v or ""


def _exports(envs: Optional[Dict[str, str]]) -> List[str]:
    out = []
    for k, v in (envs or {}).items():
        if not isinstance(k, str) or not _NAME.match(k):
            raise ValueError("envs: %r is not a variable name" % (k,))
        out.append("export %s=%s" % (k, shlex.quote(str(v))))
    return out


def _subshell(cmd: str, envs: Optional[Dict[str, str]], cwd: Optional[str]) -> str:
    """cmd run by a fresh sh in a subshell of the env's shell, with envs
    and cwd for it alone. (A fresh sh rather than eval: it is what other
    backends run, and the server's inspector can tell that it leaves the
    env's shell as it was, so such a turn costs no process checkpoint.)"""
    if not isinstance(cmd, str) or not cmd.strip():
        raise ValueError("cmd: want a non-empty command")
    lines = []
    if cwd:
        lines.append("cd -- %s || exit 1" % shlex.quote(cwd))
    lines += _exports(envs)
    lines.append("exec sh -c %s" % shlex.quote(cmd))
    return "(\n%s\n)" % "\n".join(lines)


class ArborBgJob:
    """A background process in a sandbox (OpenEnv's BgJob). Its output goes
    to files in the sandbox (``stdout_path``, ``stderr_path``)."""

    def __init__(self, sandbox: "ArborSandbox", job: str, pid: int) -> None:
        self._sb = sandbox
        self._job = job
        self._pid = pid
        self.stdout_path = "%s/%s.out" % (_BG_DIR, job)
        self.stderr_path = "%s/%s.err" % (_BG_DIR, job)
        self._rc_path = "%s/%s.rc" % (_BG_DIR, job)

    @property
    def pid(self) -> int:
        """The job's pid inside the sandbox (the leader of its process group)."""
        return self._pid

    def wait(self, timeout: Optional[float] = None) -> int:
        """Block until the job exits and return its exit status; raises
        TimeoutError when timeout (seconds) passes first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.05
        while True:
            r = self._sb._step({"tool": "read_file", "path": self._rc_path})
            if r.exit_code == 0 and r.stdout.strip():
                return int(r.stdout.strip())
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError("background job %s (pid %d) still runs after %ss" % (self._job, self._pid, timeout))
            left = pause if deadline is None else min(pause, max(deadline - time.monotonic(), 0))
            time.sleep(left)
            pause = min(pause * 2, 1.0)

    def kill(self) -> None:
        """Terminate the job and every process it started (its process
        group); wait() then returns 143 unless it had ended."""
        p = self._pid
        self._sb._step(
            "kill -TERM -%d 2>/dev/null || kill -TERM %d 2>/dev/null; sleep 0.1; "
            "kill -KILL -%d 2>/dev/null || kill -KILL %d 2>/dev/null; [ -s %s ] || echo 143 > %s; true"
            % (p, p, p, p, self._rc_path, self._rc_path))


class ArborSandbox:
    """One live Arbor env as an OpenEnv SandboxHandle, plus fork and
    rollback. Make them with ArborSandboxBackend.create."""

    def __init__(self, backend: "ArborSandboxBackend", env: Env, deadline: Optional[float]) -> None:
        self._backend = backend
        self._env = env
        self._deadline = deadline
        self._timer: Optional[threading.Timer] = None
        self._killed = False
        if deadline is not None:
            self._timer = threading.Timer(max(deadline - time.monotonic(), 0), self._expire)
            self._timer.daemon = True
            self._timer.start()

    def __repr__(self) -> str:
        return "ArborSandbox(%s, state %s)" % (self.sandbox_id, self.state_id)

    @property
    def sandbox_id(self) -> str:
        """The Arbor env id."""
        return self._env.env_id

    @property
    def state_id(self) -> Optional[str]:
        """The state the sandbox is at (after the last call that changed it)."""
        return self._env.state_id

    @property
    def env(self) -> Env:
        """The protocol v1 Env underneath (step, evaluate, states, ...)."""
        return self._env

    def _step(self, action: Union[str, Dict[str, Any]], timeout: Optional[float] = None) -> ExecResult:
        obs, _, _, _, info = self._env.step(action, timeout_s=timeout)
        return ExecResult(exit_code=int(obs.get("exit_code", -1)), stdout=_text(obs.get("stdout")),
                          stderr=_text(obs.get("stderr")), timed_out=bool(obs.get("timed_out")),
                          truncated=bool(obs.get("truncated")), state_id=info.get("state_id"))

    def exec(self, cmd: str, *, envs: Optional[Dict[str, str]] = None, cwd: Optional[str] = None,
             timeout: Optional[float] = 60) -> ExecResult:
        """Run a shell command and return its result. timeout is in seconds
        (None: the server's longest, 1 h); a command killed at it has
        timed_out set."""
        t = _NO_TIMEOUT_S if timeout is None else float(timeout)
        if t <= 0:
            raise ValueError("timeout: want a positive number of seconds, got %r" % (timeout,))
        return self._step(_subshell(cmd, envs, cwd), timeout=t)

    def start_bg(self, cmd: str, *, envs: Optional[Dict[str, str]] = None, cwd: Optional[str] = None) -> ArborBgJob:
        """Launch cmd in the background, in a process group of its own, and
        return its handle at once."""
        job = uuid.uuid4().hex[:12]
        f = "%s/%s" % (_BG_DIR, job)
        # The script records its pid (with setsid, its process group's id
        # too), runs the command and leaves its exit status.
        script = "echo $$ > %s.pid\n%s > %s.out 2> %s.err < /dev/null\necho $? > %s.rc.tmp && mv %s.rc.tmp %s.rc\n" % (
            f, _subshell(cmd, envs, cwd), f, f, f, f, f)
        eof = "ARBOR_BG_%s" % job
        launch = (
            "mkdir -p %s && cat > %s.sh <<'%s'\n%s%s\n"
            "if command -v setsid >/dev/null 2>&1; then setsid sh %s.sh >/dev/null 2>&1 </dev/null &\n"
            "else sh %s.sh >/dev/null 2>&1 </dev/null &\nfi\n"
            "i=0; while [ ! -s %s.pid ] && [ $i -lt 500 ]; do sleep 0.01; i=$((i+1)); done; cat %s.pid"
            % (_BG_DIR, f, eof, script, eof, f, f, f, f))
        r = self._step(launch)
        if r.exit_code != 0 or not r.stdout.strip().isdigit():
            raise OSError("start_bg %r: exit %d: %s" % (cmd, r.exit_code, r.stderr.strip() or r.stdout.strip()))
        return ArborBgJob(self, job, int(r.stdout.strip()))

    def write_text(self, path: str, content: str) -> None:
        """Write text to path (parent folders are created), exactly."""
        r = self._step({"tool": "write_file", "path": path, "content": content})
        if r.exit_code != 0:
            raise OSError("write %s: %s" % (path, r.stderr.strip()))

    def read_text(self, path: str) -> str:
        """Read path as text (UTF-8; bytes that are not become U+FFFD).
        Raises FileNotFoundError when it cannot be read."""
        r = self._step({"tool": "read_file", "path": path, "max_output": _READ_MAX})
        if r.exit_code != 0:
            raise FileNotFoundError("read %s: %s" % (path, r.stderr.strip()))
        if r.truncated:
            raise OSError("read %s: the file is larger than %d bytes" % (path, _READ_MAX))
        return r.stdout

    def exists(self, path: str) -> bool:
        """Whether path exists (relative paths: from the shell's cwd)."""
        return self._step("test -e %s" % shlex.quote(path)).exit_code == 0

    def kill(self) -> None:
        """Close the env; its states stay branchable for the server's
        retention. Killing twice is harmless."""
        if self._timer is not None:
            self._timer.cancel()
        if self._killed:
            return
        self._killed = True
        try:
            self._env.close()
        except ArborError as e:
            if e.code != "unknown_env":
                raise

    def _expire(self) -> None:
        try:
            self.kill()
        except Exception:  # the timer's thread has nobody to tell
            pass

    def fork(self, n: int) -> List["ArborSandbox"]:
        """n live copies of this sandbox at its current state (files,
        processes, shell), each its own sandbox with this one's remaining
        lifetime."""
        kids = self._env.branch(n)
        return [ArborSandbox(self._backend, k, self._deadline) for k in kids if k is not None]

    def rollback(self, state_id: str) -> None:
        """Return the sandbox to a state (any state id this server made)."""
        self._env.rollback(state_id)

    def checkpoint(self) -> str:
        """Checkpoint now and return the state id."""
        return self._env.checkpoint()

    def evaluate(self) -> Tuple[float, Dict[str, Any]]:
        """The task's verifier on the current state: (reward, details)."""
        return self._env.evaluate()

    def __enter__(self) -> "ArborSandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.kill()


class ArborSandboxBackend:
    """An OpenEnv SandboxBackend whose sandboxes are Arbor envs.

    url is the server's protocol v1 websocket (ws://HOST:PORT/v1/ws);
    every sandbox starts from task (its warm pool, post-setup state) or
    image, unless create's metadata names another ("task" or "image").
    client: a Client to share (else the backend opens its own; close()
    closes it)."""

    def __init__(self, url: Optional[str] = None, *, task: Optional[str] = None, image: Optional[str] = None,
                 token: Optional[str] = None, timeout: Optional[float] = 300.0,
                 client: Optional[Client] = None) -> None:
        if client is None and url is None:
            raise ValueError("give url or client")
        self._own = client is None
        self.client = client if client is not None else Client(url, token=token, timeout=timeout)
        self.task = task
        self.image = image

    def create(self, *, timeout_s: int = 900, envs: Optional[Dict[str, str]] = None,
               metadata: Optional[Dict[str, str]] = None) -> ArborSandbox:
        """A new sandbox: reset of the task or image. timeout_s is its
        lifetime (the client kills it then; 0 or None: until kill()).
        envs are exported in its shell for every command. metadata may name
        "task" or "image" (instead of the backend's) and "seed"."""
        md = dict(metadata or {})
        task = md.get("task", self.task)
        image = md.get("image", self.image if "task" not in md else None)
        if not task and not image:
            raise ValueError("no task or image: give one to ArborSandboxBackend or in metadata")
        seed = int(md["seed"]) if md.get("seed") not in (None, "") else None
        exports = _exports(envs)
        env = self.client.env(task=task or None, image=None if task else image, seed=seed)
        # A sandbox is no episode: its commands are not counted against
        # the task's max_turns (reset's options.max_turns 0, docs/protocol.md).
        env.reset(options={"max_turns": 0})
        deadline = time.monotonic() + timeout_s if timeout_s else None
        sb = ArborSandbox(self, env, deadline)
        try:
            if exports:
                r = sb._step("; ".join(exports))
                if r.exit_code != 0:
                    raise OSError("export envs: %s" % r.stderr.strip())
        except BaseException:
            sb.kill()
            raise
        return sb

    def close(self) -> None:
        """Close the backend's own client (sandboxes stay until killed)."""
        if self._own:
            self.client.close()

    def __enter__(self) -> "ArborSandboxBackend":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
