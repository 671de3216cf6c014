"""The client's framing and API against a fake server (no Arbor needed)."""

import asyncio
import threading
import time
import unittest

import arbor
from tests.fakeserver import FakeServer


class AsyncFramingTest(unittest.IsolatedAsyncioTestCase):
    def setUp(self):
        self.srv = FakeServer(token="sekrit")

    def tearDown(self):
        self.srv.stop()

    async def test_pipelined_out_of_order(self):
        async with arbor.AsyncClient(self.srv.url, token="sekrit") as c:
            self.assertEqual(c.version, 1)
            self.assertEqual(self.srv.headers.get("Authorization"), "Bearer sekrit")
            start = time.monotonic()
            slow = asyncio.ensure_future(c.call("sleep", {"ms": 300, "tag": "slow"}))
            fast = asyncio.ensure_future(c.call("sleep", {"ms": 10, "tag": "fast"}))
            done, _ = await asyncio.wait([slow, fast], return_when=asyncio.FIRST_COMPLETED)
            self.assertEqual(done, {fast})
            self.assertEqual((await slow)["tag"], "slow")
            self.assertLess(time.monotonic() - start, 0.6)  # both in flight at once
            many = await asyncio.gather(*[c.call("sleep", {"ms": (20 - i) * 5, "tag": i}) for i in range(20)])
            self.assertEqual([m["tag"] for m in many], list(range(20)))
        # Every request is [0, msgid, method, [params]] with distinct msgids.
        reqs = [f for f in self.srv.frames if f[2] == "sleep"]
        self.assertTrue(all(len(f) == 4 and f[0] == 0 and isinstance(f[3], list) and len(f[3]) == 1 for f in reqs))
        self.assertEqual(len({f[1] for f in reqs}), len(reqs))

    async def test_env_gymnasium_tuples(self):
        async with arbor.AsyncClient(self.srv.url, token="sekrit") as c:
            env = c.env(task="hello", seed=7)
            obs, info = await env.reset()
            self.assertEqual((env.env_id, env.state_id, obs["instruction"]), ("e1", "s1", "do it"))
            reset = [f for f in self.srv.frames if f[2] == "reset"][0]
            self.assertEqual(reset[3][0], {"task": "hello", "seed": 7})
            obs, reward, terminated, truncated, info = await env.step("echo hi", timeout_s=3)
            self.assertEqual((obs["stdout"], reward, terminated, truncated, env.state_id, env.turn), ("echo hi", 0.5, False, True, "s2", 1))
            step = [f for f in self.srv.frames if f[2] == "step"][0][3][0]
            self.assertEqual(step["action"], {"tool": "bash", "cmd": "echo hi", "timeout_s": 3.0})
            await env.write_file("/f", "text")
            wf = [f for f in self.srv.frames if f[2] == "step"][1][3][0]["action"]
            self.assertEqual(wf["content"], b"text")  # str content goes as bytes (msgpack bin)
            kids = await env.branch(2)
            self.assertEqual([k.env_id for k in kids], ["c0", "c1"])
            self.assertEqual(kids[0].state_id, "s2")
            self.assertEqual(await env.evaluate(), (1.0, {"exit_code": 0}))

    async def test_errors(self):
        async with arbor.AsyncClient(self.srv.url, token="sekrit") as c:
            with self.assertRaises(arbor.ArborError) as cm:
                await c.call("fail")
            self.assertEqual((cm.exception.code, cm.exception.retryable, cm.exception.infra), ("unknown_env", False, False))
            with self.assertRaises(arbor.BranchError) as cm:
                await (await _started(c)).branch(3)
            e = cm.exception
            self.assertEqual([x.env_id if x else None for x in e.envs], ["c0", None, "c2"])
            self.assertEqual(e.errors[1].code, "restore_failed")
            self.assertTrue(e.errors[1].infra and e.retryable)
            partial = await (await _started(c)).branch(3, allow_partial=True)
            self.assertIsNone(partial[1])
            # A notification tied to no request goes to listeners.
            got = []
            c.on_notification(lambda m, p: got.append((m, p["code"])))
            await c.call("notify_other")
            self.assertEqual(got, [("error", "malformed")])
            # The server hangs up: pending and later calls fail, retryable and infra.
            with self.assertRaises(arbor.ConnectionClosedError) as cm:
                await c.call("hangup")
            self.assertTrue(cm.exception.retryable and cm.exception.infra)
            with self.assertRaises(arbor.ArborError):
                await c.call("sleep", {"ms": 1, "tag": 0})

    async def test_bad_token(self):
        with self.assertRaises(arbor.ArborError) as cm:
            await arbor.AsyncClient(self.srv.url, token="wrong").connect()
        self.assertEqual(cm.exception.code, "unauthorized")

    async def test_step_batch_notifications(self):
        async with arbor.AsyncClient(self.srv.url, token="sekrit") as c:
            seen = []
            out = await c.step_batch([("a", "echo a"), ("bad", "echo b"), ("c", "echo c")],
                                     on_result=lambda i, r: seen.append(i))
            self.assertEqual(seen, [2, 1, 0])  # as they finished
            self.assertEqual(out[0][0]["stdout"], "echo a")
            self.assertIsInstance(out[1], arbor.ArborError)
            self.assertEqual(out[2][4]["state_id"], "b2")


async def _started(c):
    env = c.env(task="t")
    await env.reset()
    return env


class SyncClientTest(unittest.TestCase):
    def test_threads_share_one_connection(self):
        srv = FakeServer()
        try:
            with arbor.Client(srv.url) as c:
                env, obs, info = c.make(task="hello")
                self.assertEqual(env.env_id, "e1")
                out = env.step("ls")
                self.assertEqual(len(out), 5)
                results = {}

                def worker(i):
                    results[i] = c.call("sleep", {"ms": 100, "tag": i})["tag"]

                start = time.monotonic()
                ts = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
                [t.start() for t in ts]
                [t.join() for t in ts]
                self.assertEqual(results, {i: i for i in range(16)})
                self.assertLess(time.monotonic() - start, 1.0)  # pipelined, not 1.6 s in a row
                kids = env.branch(2)
                self.assertIsInstance(kids[0], arbor.Env)
                with self.assertRaises(arbor.BranchError) as cm:
                    env.branch(3)
                self.assertIsInstance(cm.exception.envs[0], arbor.Env)
                with self.assertRaises(arbor.ArborError) as cm:
                    c.call("fail")
                self.assertEqual(cm.exception.code, "unknown_env")
        finally:
            srv.stop()

    def test_connect_refused(self):
        with self.assertRaises(arbor.ConnectionClosedError):
            arbor.Client("ws://127.0.0.1:1/v1/ws", open_timeout=2)

    def test_client_timeout(self):
        srv = FakeServer()
        try:
            with arbor.Client(srv.url, timeout=0.2) as c:
                with self.assertRaises(arbor.ArborError) as cm:
                    c.call("sleep", {"ms": 2000, "tag": 0})
                self.assertEqual(cm.exception.code, "client_timeout")
                self.assertEqual(c.call("sleep", {"ms": 1, "tag": 1})["tag"], 1)
        finally:
            srv.stop()


if __name__ == "__main__":
    unittest.main()
