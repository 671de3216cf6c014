"""End-to-end: the client against a real `arbor serve`.

The server binary comes from $ARBOR_BIN, else bin/arbor of the repository
(`make build`). Extra arguments for `arbor serve` can be given in
$ARBOR_SERVE_ARGS. The tests skip, saying why, when there is no binary, it
has no `serve` command, or the host cannot run sandboxes (not root).

The server runs with a token and small limits (max_batch 3, max_in_flight
4), so every test also covers authentication and the client's batch
splitting and in-flight cap; tests/proxy.py sits in front of it where a
test needs a fault (a dropped connection, a bad frame).
"""

import asyncio
import os
import shlex
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import unittest
import urllib.request

import arbor_env as arbor
from tests.proxy import Proxy

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

    def __init__(self, token=None, extra=()):
        self.token = token
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
        if "--prepare" in flags:
            # The shipped tasks' image is built on the first reset of a
            # task that names it; the tests use the busybox ones.
            args += ["--prepare", "on-demand"]
        if token:
            args += ["--token", token]
        args += list(extra)
        args += shlex.split(os.environ.get("ARBOR_SERVE_ARGS", ""))
        self.log = open(os.path.join(self.dir, "serve.log"), "w+")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, cwd=REPO)
        self.url = "ws://127.0.0.1:%d/v1/ws" % self.port
        try:
            self._wait_ready(120)
        except BaseException:
            # setUpModule failed, so tearDownModule will not run: a server
            # left running would keep its pool and sandboxes.
            self.stop()
            raise

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


TOKEN = "pytest-token"
MAX_BATCH, MAX_IN_FLIGHT = 3, 4


def setUpModule():
    global _server
    _server = Server(token=TOKEN, extra=["--max-batch", str(MAX_BATCH), "--max-in-flight", str(MAX_IN_FLIGHT)])


def tearDownModule():
    if _server is not None:
        _server.stop()


def _task(c):
    tasks = c.capabilities.get("tasks") or []
    return "hello" if "hello" in tasks else (tasks[0] if tasks else None)


class EndToEndTest(unittest.TestCase):
    def test_reset_step_branch_rollback_evaluate(self):
        with arbor.Client(_server.url, token=TOKEN, timeout=120) as c:
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

    def test_tasks_and_finish(self):
        """tasks lists the shipped tasks; finish grades a leaf and closes
        it; the solved hello task scores 1 and the env is gone after."""
        with arbor.Client(_server.url, token=TOKEN, timeout=120) as c:
            page = c.tasks()
            names = [t["name"] for t in page["tasks"]]
            self.assertIn("hello", names)
            self.assertEqual(page["next_cursor"], "")
            env = c.env(task="hello")
            env.reset()
            env.step('echo "$GREETING" > /work/hello/greeting.txt')
            reward, details = env.finish()
            self.assertEqual(reward, 1.0)
            self.assertEqual(details.get("grader"), "trusted")
            self.assertTrue(env.closed)
            with self.assertRaises(arbor.ArborError) as cm:
                c.call("step", {"env_id": env.env_id, "action": {"tool": "bash", "cmd": "true"}})
            self.assertEqual(cm.exception.code, "unknown_env")
            with self.assertRaises(arbor.ArborError) as cm:
                c.tasks(dataset="no-such-dataset")
            self.assertEqual(cm.exception.code, "unknown_task")

    def test_trajectory_after_client_gone(self):
        """A client steps, branches and rolls back, then goes away; a new
        client gets every path back from the server: each turn's action
        and observation as the steps returned them."""
        def turn(res):
            obs, _, _, _, info = res
            return (obs["stdout"], obs["stderr"], obs["exit_code"], info["state_id"], info["turn"], info["checkpoint"])

        with arbor.Client(_server.url, token=TOKEN, timeout=120) as c:
            env = c.env(task=_task(c))
            env.reset()
            t1 = turn(env.step("mkdir -p /work/tr && cd /work/tr && echo a > f && echo made"))
            t2 = turn(env.step("echo b >> f; cat f; echo oops >&2; false"))
            kid = env.branch(1)[0]
            k3 = turn(kid.step("echo kid >> f; wc -l < f"))
            env.rollback(t1[3])
            t4 = turn(env.step("cat f"))
            env_id, kid_state = env.env_id, k3[3]
        with arbor.Client(_server.url, token=TOKEN, timeout=120) as c:
            def got(tr):
                return [(x["obs"]["stdout"], x["obs"]["stderr"], x["obs"]["exit_code"], x["state_id"], x["turn"], x["checkpoint"])
                        for x in tr["turns"]]
            a = c.attach(env_id)
            tr = a.trajectory()
            self.assertEqual(got(tr), [t1, t4])
            self.assertEqual(tr["turns"][1]["action"], {"tool": "bash", "cmd": "cat f"})
            self.assertEqual(got(c.trajectory(kid_state)), [t1, t2, k3])
            self.assertEqual(t2[2], 1)
            with self.assertRaises(arbor.ArborError) as cm:
                c.trajectory("s-nosuch")
            self.assertEqual(cm.exception.code, "unknown_state")
            c.call("close", {"env_id": env_id})
            for e in c.envs():
                if e["env_id"] != env_id and e.get("origin") == env_id:
                    c.call("close", {"env_id": e["env_id"]})

    def test_draft_promote_discard_and_batch(self):
        with arbor.Client(_server.url, token=TOKEN, timeout=120) as c:
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
            async with arbor.AsyncClient(_server.url, token=TOKEN) as c:
                envs = await asyncio.gather(*[c.make(image="busybox") for _ in range(4)])
                envs = [e for e, _, _ in envs]
                outs = await asyncio.gather(*[e.step("echo %d" % i) for i, e in enumerate(envs)])
                self.assertEqual([o[0]["stdout"].strip() for o in outs], ["0", "1", "2", "3"])
                await asyncio.gather(*[e.close() for e in envs])

        asyncio.run(main())


def _lines(env, path):
    obs, *_ = env.step("wc -l < %s" % path)
    return int(obs["stdout"].strip() or 0)


class RobustnessTest(unittest.TestCase):
    """The review defects of issue 18, each against the real server."""

    def test_token_and_origin(self):
        with self.assertRaises(arbor.ArborError) as cm:
            arbor.Client(_server.url, open_timeout=10)
        self.assertEqual(cm.exception.code, "unauthorized")
        # Same-origin (websocket-client's default Origin) is accepted...
        with arbor.Client(_server.url, token=TOKEN, origin="http://127.0.0.1:%d" % _server.port) as c:
            self.assertEqual(c.version, 1)
        # ...a foreign origin is not.
        with self.assertRaises(arbor.ConnectionClosedError):
            arbor.Client(_server.url, token=TOKEN, origin="http://evil.example")

    def test_close_twice(self):
        c = arbor.Client(_server.url, token=TOKEN)
        c.close()
        c.close()
        with self.assertRaises(arbor.ArborError):
            c.envs()

        async def main():
            a = arbor.AsyncClient(_server.url, token=TOKEN)
            await a.connect()
            await a.close()
            await a.close()

        asyncio.run(main())

    def test_callback_exception_keeps_connection(self):
        with arbor.Client(_server.url, token=TOKEN, timeout=120) as c:
            a, _, _ = c.make(image="busybox")
            b, _, _ = c.make(image="busybox")
            pending = {}

            def slow():
                pending["out"] = b.step("sleep 1; echo fine")

            t = threading.Thread(target=slow)
            t.start()
            time.sleep(0.2)

            def boom(i, r):
                raise ValueError("a bug in the trainer's callback")

            with self.assertRaises(ValueError):
                c.step_batch([(a, "echo 1"), (a, "echo 2")], on_result=boom)
            t.join()
            self.assertEqual(pending["out"][0]["stdout"], "fine\n")  # not a ConnectionClosedError
            obs, *_ = a.step("echo still")
            self.assertEqual(obs["stdout"], "still\n")
            self.assertEqual(c.reconnects, 0)
            a.close()
            b.close()

    def test_cancel_in_aexit_propagates(self):
        async def main():
            async with arbor.AsyncClient(_server.url, token=TOKEN) as c:
                env, _, _ = await c.make(image="busybox")
                busy = asyncio.ensure_future(env.step("sleep 2"))
                await asyncio.sleep(0.3)

                async def body():
                    async with env:
                        pass  # its close waits behind the running step

                t = asyncio.ensure_future(body())
                await asyncio.sleep(0.5)
                t.cancel()
                with self.assertRaises(asyncio.CancelledError):
                    await t
                await busy
                await env.close()

        asyncio.run(main())

    def test_undecodable_frame_closes_socket(self):
        px = Proxy(_server.url)
        try:
            with arbor.Client(px.url, token=TOKEN, timeout=60) as c:
                env, _, _ = c.make(image="busybox")
                out = {}

                def step():
                    # A step without a request key: not sent again after
                    # the reconnect, so its caller sees the error.
                    try:
                        out["r"] = c.call("step", {"env_id": env.env_id, "action": {"tool": "bash", "cmd": "sleep 2"}})
                    except arbor.ArborError as e:
                        out["e"] = e

                t = threading.Thread(target=step)
                t.start()
                time.sleep(0.5)
                start = time.monotonic()
                px.inject(b"\xc1 not msgpack")
                t.join(10)
                self.assertFalse(t.is_alive())
                self.assertLess(time.monotonic() - start, 1.5)  # not after the step's 2 s
                e = out.get("e")
                self.assertIsInstance(e, arbor.ConnectionClosedError)
                self.assertIn("undecodable", e.message)
                self.assertFalse(e.retryable)  # it was sent and may have run
                _wait(lambda: 1002 in px.closes)  # the client closed the socket: protocol error
                # A new call reconnects; the env lives on the server.
                obs, *_ = env.step("echo again")
                self.assertEqual(obs["stdout"], "again\n")
                self.assertEqual(c.reconnects, 1)
                env.close()
        finally:
            px.stop()

    def test_bad_responses_fail_their_caller(self):
        px = Proxy(_server.url)
        try:
            with arbor.Client(px.url, token=TOKEN, timeout=60) as c:
                env, _, _ = c.make(image="busybox")
                # A response of three elements to a step: its caller fails,
                # at once, and the connection goes on.
                px.transform = lambda m: m[:3] if m[0] == 1 and isinstance(m[3], dict) and "obs" in m[3] else m
                with self.assertRaises(arbor.BadResponseError):
                    env.step("echo x")
                # A result of the wrong type.
                px.transform = lambda m: [1, m[1], None, ["not", "a", "map"]] if m[0] == 1 and isinstance(m[3], dict) and "obs" in m[3] else m
                with self.assertRaises(arbor.BadResponseError):
                    env.step("echo x")

                # No reward: a step's is None, an evaluation's an infra error, never 0.0.
                def strip(m):
                    if m[0] == 1 and isinstance(m[3], dict):
                        m[3].pop("reward", None)
                    return m

                px.transform = strip
                obs, reward, *_ = env.step("echo y")
                self.assertIsNone(reward)
                px.transform = None
                ev = c.make(task=_task(c))[0]
                px.transform = strip
                with self.assertRaises(arbor.ArborError) as cm:
                    ev.evaluate()
                self.assertTrue(cm.exception.infra)
                px.transform = None
                reward, _ = ev.evaluate()
                self.assertIsInstance(reward, float)
                self.assertEqual(c.reconnects, 0)
                ev.close()
                env.close()
        finally:
            px.stop()

    def test_branch_state_children_and_promote(self):
        with arbor.Client(_server.url, token=TOKEN, timeout=120) as c:
            task = _task(c)
            env, _, _ = c.make(task=task)
            env.step("echo a > /tmp/a")
            _, _, _, _, info = env.step("echo b > /tmp/b")
            self.assertEqual(info["turn"], 2)
            kids = c.branch_state(info["state_id"], 2)
            for k in kids:
                self.assertEqual((k.task, k.turn, k.state_id), (task, 2, info["state_id"]))
                _, _, _, _, kinfo = k.step("ls /tmp")
                self.assertEqual(kinfo["turn"], 3)
                k.close()
            # promote: the parent object takes the promoted state and turn.
            draft, = env.branch(1)
            draft.step("echo c > /tmp/c")
            draft.step("echo d > /tmp/d")
            sid = draft.promote()
            self.assertEqual(env.state_id, sid)
            listed = [e for e in c.envs() if e["env_id"] == env.env_id][0]
            self.assertEqual((env.state_id, env.turn), (listed["head"], listed["turn"]))
            _, _, _, _, info = env.step("cat /tmp/d")
            self.assertEqual(info["turn"], listed["turn"] + 1)
            env.close()

    def test_prepare_past_state(self):
        with arbor.Client(_server.url, token=TOKEN, timeout=120) as c:
            env, _, _ = c.make(image="busybox")
            _, _, _, _, past = env.step("echo 1 > /tmp/f")
            env.step("echo 2 > /tmp/f")
            sid = past["state_id"]
            res = c.prepare([sid], 2, wait=True)
            self.assertEqual(res["prepared"], {sid: 2})
            self.assertEqual(res["ready"], {sid: 2})
            self.assertNotIn("refused", res)
            kids = c.branch_state(sid, 2)
            for k in kids:
                obs, _, _, _, _ = k.step("cat /tmp/f")
                self.assertEqual(obs["stdout"].strip(), "1")
                k.close()
            with self.assertRaises(arbor.ArborError) as cm:
                c.prepare([sid], 0)
            self.assertEqual(cm.exception.code, "invalid_params")
            with self.assertRaises(arbor.ArborError) as cm:
                c.prepare(["s-nosuch"], 1)
            self.assertEqual(cm.exception.code, "unknown_state")
            env.close()

    def test_batch_split_and_in_flight_cap(self):
        self.assertEqual(MAX_BATCH, 3)

        async def main():
            async with arbor.AsyncClient(_server.url, token=TOKEN) as c:
                self.assertEqual(c.capabilities["max_batch"], MAX_BATCH)
                envs = [e for e, _, _ in await asyncio.gather(*[c.make(image="busybox") for _ in range(3)])]
                seen = []
                items = [(envs[i % 3], "echo %d" % i) for i in range(8)]
                out = await c.step_batch(items, on_result=lambda i, r: seen.append(i))
                self.assertEqual(sorted(seen), list(range(8)))
                self.assertEqual([o[0]["stdout"].strip() for o in out], [str(i) for i in range(8)])
                # 5x the server's max_in_flight at once: none is refused.
                outs = await asyncio.gather(*[envs[i % 3].step("echo %d" % i) for i in range(5 * MAX_IN_FLIGHT)])
                self.assertEqual([o[0]["stdout"].strip() for o in outs], [str(i) for i in range(5 * MAX_IN_FLIGHT)])
                await asyncio.gather(*[e.close() for e in envs])

        asyncio.run(main())


class IdempotenceTest(unittest.TestCase):
    def test_keyed_step_retry(self):
        with arbor.Client(_server.url, token=TOKEN, timeout=120) as c:
            self.assertTrue(c.capabilities.get("step_keys"))
            env, _, _ = c.make(image="busybox")
            first = env.step("echo x >> /tmp/log; wc -l < /tmp/log", key="k-1")
            again = env.step("echo x >> /tmp/log; wc -l < /tmp/log", key="k-1")
            self.assertTrue(again[4].get("replayed"))
            self.assertEqual(again[4]["state_id"], first[4]["state_id"])
            self.assertEqual(_lines(env, "/tmp/log"), 1)
            env.close()

    def test_timeout_then_safe_retry(self):
        with arbor.Client(_server.url, token=TOKEN, timeout=120) as c:
            env, _, _ = c.make(image="busybox")
            cmd = "sleep 1.5; echo y >> /tmp/slow; wc -l < /tmp/slow"
            with self.assertRaises(arbor.ClientTimeoutError) as cm:
                env.step(cmd, timeout=0.3)
            e = cm.exception
            self.assertTrue(e.retryable and e.infra and e.request_key)
            obs, _, _, _, info = env.step(cmd, key=e.request_key)
            self.assertTrue(info.get("replayed"))
            self.assertEqual(obs["stdout"].strip(), "1")
            self.assertEqual(_lines(env, "/tmp/slow"), 1)
            # Without a key the client does not call the timeout retryable.
            with self.assertRaises(arbor.ClientTimeoutError) as cm:
                c.call("step", {"env_id": env.env_id, "action": {"tool": "bash", "cmd": "sleep 1"}}, timeout=0.3)
            self.assertFalse(cm.exception.retryable)
            self.assertIn("not safe", cm.exception.message)
            env.close()

    def test_async_per_call_timeout(self):
        async def main():
            async with arbor.AsyncClient(_server.url, token=TOKEN, timeout=120) as c:
                env, _, _ = await c.make(image="busybox")
                with self.assertRaises(arbor.ClientTimeoutError):
                    await env.step("sleep 1", timeout=0.2)
                obs, *_ = await env.step("echo ok", timeout=30)
                self.assertEqual(obs["stdout"], "ok\n")
                await env.close()

        asyncio.run(main())

    def test_reconnect_resends_batch_once(self):
        px = Proxy(_server.url)
        try:
            with arbor.Client(px.url, token=TOKEN, timeout=60) as c:
                a, _, _ = c.make(image="busybox")
                b, _, _ = c.make(image="busybox")
                cmd = "sleep 0.8; echo q >> /tmp/q; wc -l < /tmp/q"
                seen = []
                threading.Timer(0.4, px.drop).start()
                out = c.step_batch([(a, cmd), (b, cmd), (a, cmd), (b, cmd)], on_result=lambda i, r: seen.append(i))
                self.assertEqual(c.reconnects, 1)
                self.assertFalse([o for o in out if isinstance(o, arbor.ArborError)], out)
                self.assertEqual(sorted(seen), [0, 1, 2, 3])  # each item once
                self.assertEqual([o[0]["stdout"].strip() for o in out], ["1", "1", "2", "2"])
                self.assertEqual((_lines(a, "/tmp/q"), _lines(b, "/tmp/q")), (2, 2))  # no item ran twice
                a.close()
                b.close()
        finally:
            px.stop()

    def test_reconnect_resends_keyed_step_and_attach(self):
        px = Proxy(_server.url)
        try:
            with arbor.Client(px.url, token=TOKEN, timeout=60) as c:
                env, _, _ = c.make(image="busybox")
                out = {}

                def step():
                    out["r"] = env.step("sleep 1; echo z >> /tmp/z; wc -l < /tmp/z")

                t = threading.Thread(target=step)
                t.start()
                time.sleep(0.4)
                px.drop()  # the answer is lost with the connection
                t.join(30)
                obs, _, _, _, info = out["r"]
                self.assertEqual(obs["stdout"].strip(), "1")
                self.assertTrue(info.get("replayed"))  # sent again, answered from the record
                self.assertEqual(c.reconnects, 1)
                self.assertEqual(_lines(env, "/tmp/z"), 1)

                # A call that is not idempotent and was in flight fails,
                # not retryable: it may have run.
                out.clear()

                def branch():
                    try:
                        out["r"] = c.call("branch", {"env_id": env.env_id, "n": 1})
                    except arbor.ArborError as e:
                        out["e"] = e

                busy = threading.Thread(target=lambda: env.step("sleep 1"))
                busy.start()
                time.sleep(0.2)
                t = threading.Thread(target=branch)
                t.start()
                time.sleep(0.3)
                px.drop()
                t.join(30)
                busy.join(30)
                if "e" in out:
                    self.assertIsInstance(out["e"], arbor.ConnectionClosedError)
                    self.assertFalse(out["e"].retryable)
                self.assertEqual(c.reconnects, 2)

                # Another client attaches to the env by id.
                with arbor.Client(_server.url, token=TOKEN, timeout=60) as c2:
                    same = c2.attach(env.env_id)
                    self.assertEqual((same.state_id, same.turn, same.image), (env.state_id, env.turn, env.image))
                    obs, *_ = same.step("cat /tmp/z")
                    self.assertEqual(obs["stdout"], "z\n")
                    with self.assertRaises(arbor.ArborError) as cm:
                        c2.attach("nope")
                    self.assertEqual(cm.exception.code, "unknown_env")
                for e in c.envs():
                    if e.get("origin") == env.env_id:
                        c.call("close", {"env_id": e["env_id"]})
                env.close()
        finally:
            px.stop()


class PoolAndEpisodeTest(unittest.TestCase):
    def test_pool_first_finishers_and_stream(self):
        async def main():
            async with arbor.AsyncClient(_server.url, token=TOKEN, timeout=120) as c:
                pool = await arbor.AsyncEnvPool.make(c, 4, image="busybox", fork=True)
                async with pool:
                    ids = pool.env_ids
                    self.assertEqual(len(set(ids)), 4)
                    pool.send(["sleep 1.5; echo slow"] * 3 + ["echo fast"])
                    with self.assertRaises(ValueError):
                        pool.send(["ls"], env_ids=[ids[0]])  # has a step in flight
                    first = await pool.recv(min_results=1, timeout=30)
                    self.assertEqual(first[0].env_id, ids[3])
                    self.assertEqual(first[0].obs["stdout"], "fast\n")
                    self.assertEqual(await pool.recv(min_results=3, timeout=0.1), [])  # the slow ones still run
                    rest = await pool.recv(timeout=30)
                    self.assertEqual(sorted(r.env_id for r in rest), sorted(ids[:3]))
                    self.assertTrue(all(r.error is None and r.obs["stdout"] == "slow\n" for r in rest))
                    self.assertEqual(await pool.recv(), [])  # nothing in flight
                    pool.send(["echo again"], env_ids=[ids[0]])
                    again = await pool.recv(min_results=1)
                    self.assertEqual((again[0].env_id, again[0].obs["stdout"]), (ids[0], "again\n"))

                    # A streaming step_batch over more items than max_batch.
                    items = [(pool.envs[0], "sleep 1; echo 0")] + [(pool.envs[1 + i % 3], "echo %d" % (i + 1)) for i in range(4)]
                    order = []
                    async for i, outcome in arbor.step_batch_stream(c, items):
                        order.append(i)
                        self.assertEqual(outcome[0]["stdout"], "%d\n" % i)
                    self.assertEqual(sorted(order), list(range(5)))
                    self.assertEqual(order[-1], 0)  # the slow item last
        asyncio.run(main())

    def test_episode_submit_max_turns_and_agent_errors(self):
        with arbor.Client(_server.url, token=TOKEN, timeout=120) as c:
            if "hello" not in (c.capabilities.get("tasks") or []):
                self.skipTest("no hello task")
            env = c.env(task="hello")
            ep = arbor.Episode(env)
            obs, info = ep.reset()
            self.assertEqual(ep.max_turns, info["max_turns"])  # the task's
            _, reward, *_ = ep.step({"tool": "bash"})  # no cmd: the agent's mistake
            self.assertEqual(reward, 0.0)
            self.assertIn("invalid_params", ep.trajectory.turns[-1].error)
            ep.step('echo "$GREETING" > /work/hello/greeting.txt')
            obs, reward, terminated, truncated, info = ep.step(arbor.SUBMIT)
            t = ep.trajectory
            self.assertEqual((reward, terminated, t.end, t.masked, t.reward), (1.0, True, "submit", False, 1.0))
            self.assertEqual(len(t.state_ids), 3)
            with self.assertRaises(arbor.ArborError):
                ep.step("ls")  # over

            # max_turns ends the episode with the verifier's reward.
            script = iter(["ls", "pwd", "ls /"])
            traj = c.run_episode(env, lambda obs, info: next(script), max_turns=2)
            self.assertEqual((traj.end, traj.reward, traj.masked, len(traj.turns)), ("max_turns", 0.0, False, 2))
            env.close()

    def test_episode_masked_on_infra_failure(self):
        px = Proxy(_server.url)
        try:
            with arbor.Client(px.url, token=TOKEN, timeout=60, reconnect=False) as c:
                env = c.env(image="busybox")
                ep = arbor.Episode(env, max_turns=5)
                ep.reset()
                ep.step("echo 1")
                threading.Timer(0.4, px.drop).start()
                obs, reward, terminated, truncated, info = ep.step("sleep 1.5")
                t = ep.trajectory
                self.assertTrue(t.masked and info["masked"])
                self.assertIsNone(reward)
                self.assertIsNone(t.reward)
                self.assertEqual(t.end, "masked")
                self.assertIn("connection_closed", t.mask_reason)
            with arbor.Client(_server.url, token=TOKEN) as c2:
                c2.attach(env.env_id).close()
        finally:
            px.stop()


class ClientConformanceTest(unittest.TestCase):
    """Issue 37's Python client cases, each against the real server."""

    def test_wrong_url_fails_fast_not_infra(self):
        base = "127.0.0.1:%d" % _server.port
        for url, says in [
            ("http://%s/v1/ws" % base, "not ws:// or wss://"),  # the scheme
            ("ws://%s/v2/ws" % base, "HTTP 404"),  # a wrong path
            ("ws://%s/livez" % base, "HTTP 200"),  # a page, no upgrade
        ]:
            with self.subTest(url=url):
                with self.assertRaises(arbor.BadURLError) as cm:
                    arbor.Client(url, token=TOKEN, open_timeout=10)
                e = cm.exception
                self.assertEqual((e.code, e.retryable, e.infra), ("bad_url", False, False))
                self.assertIn(url, e.message)
                self.assertIn(says, e.message)
                self.assertIn("ws://HOST:PORT/v1/ws", e.message)

                async def main():
                    with self.assertRaises(arbor.BadURLError):
                        async with arbor.AsyncClient(url, token=TOKEN, reconnect=True):
                            pass

                asyncio.run(main())
        # Nothing listening: a retryable infra error, as before.
        with self.assertRaises(arbor.ConnectionClosedError) as cm:
            arbor.Client("ws://127.0.0.1:%d/v1/ws" % _free_port(), token=TOKEN, open_timeout=10)
        self.assertTrue(cm.exception.retryable and cm.exception.infra)

    def test_submit_step_ends_episode(self):
        with arbor.Client(_server.url, token=TOKEN, timeout=120) as c:
            env = c.env(task="hello")
            env.reset()
            env.step('echo "$GREETING" > /work/hello/greeting.txt')
            obs, reward, terminated, truncated, info = env.step(arbor.SUBMIT)
            self.assertEqual((obs, reward, terminated, truncated), ({}, 1.0, True, False))
            self.assertTrue(info["submitted"] and env.done and env.submitted)
            self.assertEqual(info["state_id"], env.state_id)
            self.assertEqual(info["turn"], 1)
            # After submit: refused until reset or rollback, as OpenEnv's endpoint does.
            with self.assertRaises(arbor.ArborError) as cm:
                env.step("ls")
            self.assertEqual(cm.exception.code, "bad_request")
            self.assertIn("submitted", cm.exception.message)
            env.rollback(info["state_id"])
            self.assertFalse(env.done)
            obs, *_ = env.step("cat /work/hello/greeting.txt")
            self.assertEqual(obs["stdout"], "hello, arbor\n")
            env.close()

            # An image's env has no verifier: reward None, still terminated.
            img = c.env(image="busybox")
            img.reset()
            obs, reward, terminated, truncated, info = img.step(arbor.SUBMIT)
            self.assertEqual((reward, terminated, truncated), (None, True, False))
            self.assertIn("verifier", info["evaluation"]["error"])
            img.close()

    def test_done_and_step_after_truncation(self):
        with arbor.Client(_server.url, token=TOKEN, timeout=120) as c:
            env = c.env(task="hello")
            _, info = env.reset()
            limit = info["max_turns"]
            for i in range(limit):
                _, _, terminated, truncated, info = env.step("echo %d" % i)
                self.assertEqual(env.done, terminated or truncated)
                self.assertEqual(truncated, i == limit - 1)
            self.assertTrue(env.done)
            # Past max_turns the server refuses the step (docs/protocol.md,
            # "Episode end"); done stays true.
            with self.assertRaises(arbor.ArborError) as cm:
                env.step("echo past")
            self.assertEqual(cm.exception.code, "bad_request")
            self.assertIn("episode is over", str(cm.exception))
            self.assertTrue(env.done)
            env.close()

    def test_episode_done_matches_masked_submit(self):
        px = Proxy(_server.url)
        try:
            evaluates = set()

            def fail_evaluate(msg):
                for r in px.requests:
                    if isinstance(r, list) and len(r) > 2 and r[2] == "evaluate":
                        evaluates.add(r[1])
                if msg[0] == 1 and msg[1] in evaluates:
                    return [1, msg[1], {"code": "sandbox_failed", "message": "injected", "retryable": False, "infra": True}, None]
                return msg

            px.transform = fail_evaluate
            with arbor.Client(px.url, token=TOKEN, timeout=120) as c:
                env = c.env(task="hello")
                ep = arbor.Episode(env)
                ep.reset()
                _, reward, terminated, truncated, info = ep.step(arbor.SUBMIT)
                self.assertTrue(info["masked"] and ep.done)
                self.assertIsNone(reward)
                self.assertEqual(terminated or truncated, ep.done)
                env.close()
        finally:
            px.stop()

    def test_in_flight_cap_configurable(self):
        px = Proxy(_server.url)
        try:
            async def main():
                async with arbor.AsyncClient(px.url, token=TOKEN, max_in_flight=2) as c:
                    self.assertEqual(c.max_in_flight, 2)
                    envs = [e for e, _, _ in await asyncio.gather(*[c.make(image="busybox") for _ in range(3)])]
                    outs = await asyncio.gather(*[envs[i % 3].step("sleep 0.2; echo %d" % i) for i in range(9)])
                    self.assertEqual([o[0]["stdout"].strip() for o in outs], [str(i) for i in range(9)])
                    await asyncio.gather(*[e.close() for e in envs])
                # Never above the server's.
                async with arbor.AsyncClient(px.url, token=TOKEN, max_in_flight=1000) as c:
                    self.assertEqual(c.max_in_flight, MAX_IN_FLIGHT)

            asyncio.run(main())
            self.assertLessEqual(px.peak_in_flight, 2)
            with arbor.Client(_server.url, token=TOKEN, max_in_flight=3) as c:
                self.assertEqual(c.max_in_flight, 3)
        finally:
            px.stop()

    def test_too_many_requests_sent_again(self):
        # too_many_requests (the connection's in-flight count, which the
        # server drops just after sending an answer, or its answer memory)
        # is refused before anything runs: the client waits and sends the
        # request again instead of failing the trainer's call. The proxy
        # turns the server's first three answers to `envs` into that error.
        px = Proxy(_server.url)
        try:
            refused = []

            def busy(msg):
                ids = {r[1] for r in px.requests if isinstance(r, list) and len(r) > 2 and r[2] == "envs"}
                if msg[0] == 1 and msg[1] in ids and len(refused) < 3:
                    refused.append(msg[1])
                    return [1, msg[1], {"code": "too_many_requests", "message": "injected: %d requests in flight" % MAX_IN_FLIGHT,
                                        "retryable": True, "infra": False}, None]
                return msg

            px.transform = busy
            with arbor.Client(px.url, token=TOKEN, timeout=60) as c:
                self.assertIsInstance(c.envs(), list)
            self.assertEqual(len(refused), 3)
            self.assertEqual(sum(1 for r in px.requests if isinstance(r, list) and len(r) > 2 and r[2] == "envs"), 4)
        finally:
            px.stop()


def _wait(cond, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError("condition not met within %ss" % timeout)


if __name__ == "__main__":
    unittest.main()
