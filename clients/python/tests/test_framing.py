"""The client's framing and API against a fake server (no Arbor needed)."""

import asyncio
import threading
import time
import unittest

import arbor_env as arbor
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
            # The server hangs up: the pending call fails, infra, not
            # retryable (it was sent and may have run); the next call
            # reconnects.
            with self.assertRaises(arbor.ConnectionClosedError) as cm:
                await c.call("hangup")
            self.assertTrue(cm.exception.infra and cm.exception.sent)
            self.assertFalse(cm.exception.retryable)
            self.assertEqual((await c.call("sleep", {"ms": 1, "tag": 0}))["tag"], 0)
            self.assertEqual(c.reconnects, 1)

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


class DefectsTest(unittest.IsolatedAsyncioTestCase):
    """Issue 18's review defects against the fake server (the same against
    a real `arbor serve` are in test_e2e.py)."""

    def setUp(self):
        self.srv = FakeServer(capabilities={"max_batch": 2, "max_in_flight": 3, "step_keys": True})

    def tearDown(self):
        self.srv.stop()

    async def test_callback_exceptions(self):
        async with arbor.AsyncClient(self.srv.url) as c:
            slow = asyncio.ensure_future(c.call("sleep", {"ms": 200, "tag": "s"}))

            def boom(i, r):
                raise KeyError("trainer bug")

            with self.assertRaises(KeyError):
                await c.step_batch([("a", "echo a"), ("c", "echo c")], on_result=boom)
            self.assertEqual((await slow)["tag"], "s")
            c.on_notification(lambda m, p: 1 / 0)
            await c.call("notify_other")  # the listener's error is logged, not fatal
            self.assertEqual((await c.call("sleep", {"ms": 1, "tag": 1}))["tag"], 1)
            self.assertEqual(c.reconnects, 0)

    async def test_undecodable_and_unattributable_frames(self):
        async with arbor.AsyncClient(self.srv.url, reconnect=False) as c:
            pending = asyncio.ensure_future(c.call("sleep", {"ms": 5000, "tag": 0}))
            await asyncio.sleep(0.05)
            with self.assertRaises(arbor.ConnectionClosedError) as cm:
                await asyncio.wait_for(c.call("garbage"), 2)
            self.assertIn("undecodable", cm.exception.message)
            with self.assertRaises(arbor.ConnectionClosedError):
                await asyncio.wait_for(pending, 2)
        async with arbor.AsyncClient(self.srv.url) as c:
            with self.assertRaises(arbor.ConnectionClosedError) as cm:
                await asyncio.wait_for(c.call("noid"), 2)
            self.assertIn("msgid", cm.exception.message)

    async def test_bad_shapes_fail_the_caller(self):
        async with arbor.AsyncClient(self.srv.url) as c:
            with self.assertRaises(arbor.BadResponseError):
                await asyncio.wait_for(c.call("short"), 2)
            env = c.env(task="t")
            await env.reset()
            self.srv.evaluate_result = {"details": {}}
            with self.assertRaises(arbor.BadResponseError) as cm:
                await env.evaluate()
            self.assertTrue(cm.exception.infra)
            self.srv.step_extra = {"reward": None}
            obs, reward, *_ = await env.step("x")
            self.assertIsNone(reward)  # none sent: not made up as 0.0
            self.srv.step_extra = {"obs": None}
            with self.assertRaises(arbor.BadResponseError):
                await env.step("x")
            self.assertEqual((await c.call("sleep", {"ms": 1, "tag": 2}))["tag"], 2)

    async def test_close_twice_and_cancel(self):
        c = arbor.AsyncClient(self.srv.url)
        await c.connect()
        env = c.env(task="t")
        await env.reset()

        async def body():
            async with env:
                await asyncio.sleep(10)

        t = asyncio.ensure_future(body())
        await asyncio.sleep(0.05)
        t.cancel()
        with self.assertRaises(asyncio.CancelledError):
            await t
        await c.close()
        await c.close()

    async def test_limits_from_hello(self):
        async with arbor.AsyncClient(self.srv.url) as c:
            await asyncio.gather(*[c.call("sleep", {"ms": 30, "tag": i}) for i in range(12)])
            self.assertLessEqual(self.srv.max_seen_in_flight, 3)
            seen = []
            out = await c.step_batch([("e%d" % i, "echo %d" % i) for i in range(5)], on_result=lambda i, r: seen.append(i))
            self.assertEqual([o[0]["stdout"] for o in out], ["echo %d" % i for i in range(5)])
            self.assertEqual(sorted(seen), list(range(5)))
            batches = [f for f in self.srv.frames if f[2] == "step_batch"]
            self.assertEqual([len(f[3][0]["items"]) for f in batches], [2, 2, 1])
            self.assertTrue(all(it.get("key") for f in batches for it in f[3][0]["items"]))

    async def test_timeouts(self):
        async with arbor.AsyncClient(self.srv.url) as c:
            with self.assertRaises(arbor.ClientTimeoutError) as cm:
                await c.call("sleep", {"ms": 1000, "tag": 0}, timeout=0.1)
            self.assertFalse(cm.exception.retryable)
            env = c.env(task="t")
            await env.reset()
            obs, reward, *_ = await env.step("x")
            key = [f for f in self.srv.frames if f[2] == "step"][-1][3][0].get("key")
            self.assertTrue(key)  # every step has a request key on a step_keys server


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
