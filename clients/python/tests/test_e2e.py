"""End-to-end: the client against a real `arbor serve`.

The server binary comes from $ARBOR_BIN, else bin/arbor of the repository
(`make build`). Extra arguments for `arbor serve` can be given in
$ARBOR_SERVE_ARGS. The tests skip, saying why, when there is no binary, it
has no `serve` command, or the host cannot run sandboxes (not root).
"""

import asyncio
import os
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
import unittest
import urllib.request

import arbor

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def _binary():
    b = os.environ.get("ARBOR_BIN") or os.path.join(REPO, "bin", "arbor")
    return b if os.path.isfile(b) and os.access(b, os.X_OK) else None


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pick(flags, *cands):
    for c in cands:
        if c in flags:
            return c
    return None


class Server:
    """Runs `arbor serve` on a free loopback port with a temporary state dir."""

    def __init__(self):
        self.bin = _binary()
        if self.bin is None:
            raise unittest.SkipTest("no arbor binary: run `make build` or set ARBOR_BIN")
        if os.geteuid() != 0:
            raise unittest.SkipTest("arbor serve needs root (namespaces, cgroups, CRIU)")
        h = subprocess.run([self.bin, "serve", "--help"], capture_output=True, text=True, timeout=30)
        if h.returncode != 0:
            raise unittest.SkipTest("%s has no working `serve` command yet: %s" % (self.bin, (h.stderr or h.stdout).strip()[:200]))
        flags = h.stdout + h.stderr
        self.port = _free_port()
        self.dir = tempfile.mkdtemp(prefix="arbor-pytest-")
        args = [self.bin, "serve"]
        listen = _pick(flags, "--listen", "--addr")
        state = _pick(flags, "--state-dir", "--state")
        if listen is None or state is None:
            raise unittest.SkipTest("cannot tell how to set the address and state dir of `arbor serve`: %s" % flags[:300])
        args += [listen, "127.0.0.1:%d" % self.port, state, self.dir]
        tasks = _pick(flags, "--tasks", "--task-dir")
        if tasks:
            args += [tasks, os.path.join(REPO, "tasks")]
        args += shlex.split(os.environ.get("ARBOR_SERVE_ARGS", ""))
        self.log = open(os.path.join(self.dir, "serve.log"), "w+")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, cwd=REPO)
        self.url = "ws://127.0.0.1:%d/v1/ws" % self.port
        self._wait_ready(120)

    def _wait_ready(self, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError("arbor serve exited with %s:\n%s" % (self.proc.returncode, self.output()))
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/readyz" % self.port, timeout=2) as r:
                    if r.status == 200:
                        return
            except Exception:
                pass
            time.sleep(0.1)
        raise AssertionError("arbor serve not ready after %ss:\n%s" % (timeout, self.output()))

    def output(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-4000:]

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        # The server keeps its hot-image tmpfs (and may keep its pool)
        # mounted for the next start: a test must not leave them behind.
        with open("/proc/self/mounts") as f:
            points = [line.split()[1] for line in f]
        for p in sorted((p for p in points if p.startswith(self.dir + "/")), key=len, reverse=True):
            subprocess.run(["umount", "-l", p], check=False)
        shutil.rmtree(self.dir, ignore_errors=True)


_server = None


def setUpModule():
    global _server
    _server = Server()


def tearDownModule():
    if _server is not None:
        _server.stop()


def _task(c):
    tasks = c.capabilities.get("tasks") or []
    return "hello" if "hello" in tasks else (tasks[0] if tasks else None)


class EndToEndTest(unittest.TestCase):
    def test_reset_step_branch_rollback_evaluate(self):
        with arbor.Client(_server.url, timeout=120) as c:
            task = _task(c)
            self.assertIsNotNone(task, "server offers no task")
            env = c.env(task=task)
            obs, info = env.reset(seed=5)
            self.assertTrue(info["state_id"])
            self.assertEqual(info.get("turn", 0), 0)
            if task == "hello":
                self.assertIn("greeting", obs.get("instruction", ""))
            obs, reward, terminated, truncated, info = env.step("mkdir -p /work/t && cd /work/t && echo base > f && X=1")
            self.assertEqual(obs["exit_code"], 0, obs)
            base = info["state_id"]
            obs, *_ = env.step("cat f; echo $ARBOR_SEED")
            self.assertEqual(obs["stdout"].split(), ["base", "5"])
            self.assertEqual(obs["cwd"], "/work/t")

            kids = env.branch(4)
            self.assertEqual(len(kids), 4)
            for i, k in enumerate(kids):
                obs, *_ = k.step("echo child%d > f; X=%d" % (i, i + 10))
                self.assertEqual(obs["exit_code"], 0, obs)
            for i, k in enumerate(kids):
                obs, *_ = k.step("cat f; echo $X; pwd")
                self.assertEqual(obs["stdout"].split(), ["child%d" % i, str(i + 10), "/work/t"])
            obs, *_ = env.step("cat f; echo $X")
            self.assertEqual(obs["stdout"].split(), ["base", "1"], "the parent saw its children's changes")

            env.step("echo changed > f; X=2")
            info = env.rollback(base)
            self.assertEqual(env.state_id, base)
            obs, *_ = env.step("cat f; echo $X")
            self.assertEqual(obs["stdout"].split(), ["base", "1"])

            reward, details = env.evaluate()
            self.assertIsInstance(reward, float)
            self.assertIn("exit_code", details)
            if task == "hello":
                self.assertEqual(reward, 0.0)
                env.step('echo "$GREETING" > /work/hello/greeting.txt')
                reward, details = env.evaluate()
                self.assertEqual(reward, 1.0, details)
            for k in kids:
                k.close()
            env.close()
            with self.assertRaises(arbor.ArborError) as cm:
                c.call("step", {"env_id": env.env_id, "action": {"tool": "bash", "cmd": "ls"}})
            self.assertEqual(cm.exception.code, "unknown_env")
            self.assertFalse(cm.exception.infra)

    def test_draft_promote_discard_and_batch(self):
        with arbor.Client(_server.url, timeout=120) as c:
            env, obs, info = c.make(image="busybox")
            env.step("echo v0 > /tmp/draft")
            good, bad = env.branch(2)
            good.step("echo v1 > /tmp/draft")
            bad.step("echo broken > /tmp/draft")
            bad.discard()
            good.promote()
            obs, *_ = env.step("cat /tmp/draft")
            self.assertEqual(obs["stdout"].strip(), "v1")
            kids = env.branch(3)
            seen = []
            out = c.step_batch([(k, "echo %d > /tmp/n; cat /tmp/n" % i) for i, k in enumerate(kids)] + [("nope", "ls")],
                               on_result=lambda i, r: seen.append(i))
            self.assertEqual(sorted(seen), [0, 1, 2, 3])
            self.assertEqual([o[0]["stdout"].strip() for o in out[:3]], ["0", "1", "2"])
            self.assertIsInstance(out[3], arbor.ArborError)
            for k in kids + [env]:
                k.close()

    def test_async_pipelined(self):
        async def main():
            async with arbor.AsyncClient(_server.url) as c:
                envs = await asyncio.gather(*[c.make(image="busybox") for _ in range(4)])
                envs = [e for e, _, _ in envs]
                outs = await asyncio.gather(*[e.step("echo %d" % i) for i, e in enumerate(envs)])
                self.assertEqual([o[0]["stdout"].strip() for o in outs], ["0", "1", "2", "3"])
                await asyncio.gather(*[e.close() for e in envs])

        asyncio.run(main())


if __name__ == "__main__":
    unittest.main()
