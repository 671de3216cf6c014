"""Back-off on a busy server: the client against a real `arbor serve` whose
admission control admits one step at a time and lets none wait more than
1 s (--admit-slots step=1 --admit-wait 1s; docs/protocol.md, Errors).

A flood of steps on several envs meets too_many_requests answers with
retry_after_ms; the client waits them out (with jitter) and every step
ends done. A client that does not retry (busy_retries=0) surfaces the busy
answer with its hint.
"""

import asyncio
import re
import unittest
import urllib.request

import arbor_env as arbor
from tests.test_e2e import Server

_server = None


def setUpModule():
    global _server
    _server = Server(extra=["--admit-slots", "step=1", "--admit-wait", "1s"])


def tearDownModule():
    if _server is not None:
        _server.stop()


def _step_busy():
    """arbor_admit_busy_total{class="step"} of the server's /metrics."""
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % _server.port, timeout=10) as r:
        text = r.read().decode()
    m = re.search(r'^arbor_admit_busy_total\{class="step"\} (\S+)$', text, re.M)
    if m is None:
        raise AssertionError("no arbor_admit_busy_total{class=\"step\"} in /metrics")
    return float(m.group(1))


class BusyTest(unittest.TestCase):
    def flood(self, c, n):
        async def run():
            envs = [(await c.make(image="busybox"))[0] for _ in range(n)]
            try:
                return await asyncio.gather(*[e.step("sleep 0.5") for e in envs], return_exceptions=True)
            finally:
                for e in envs:
                    await e.close()
        return run()

    def test_backs_off_until_done(self):
        async def main():
            async with arbor.AsyncClient(_server.url, timeout=180, busy_max_wait=120) as c:
                before = _step_busy()
                # Warm the server's service time, then 6 steps at once over
                # one slot and about 2 waiters' room: some are refused.
                await self.flood(c, 1)
                outs = await self.flood(c, 6)
                for o in outs:
                    self.assertNotIsInstance(o, BaseException, o)
                    obs = o[0]
                    self.assertEqual(obs["exit_code"], 0, obs)
                self.assertGreater(_step_busy() - before, 0, "the flood met no busy answer: nothing was backed off")
        asyncio.run(main())

    def test_surfaces_busy_without_retries(self):
        async def main():
            async with arbor.AsyncClient(_server.url, timeout=180, busy_retries=0) as c:
                await self.flood(c, 1)
                outs = await self.flood(c, 6)
                busy = [o for o in outs if isinstance(o, arbor.ArborError)]
                for o in outs:
                    if isinstance(o, BaseException):
                        self.assertIsInstance(o, arbor.ArborError, o)
                        self.assertEqual(o.code, "too_many_requests", o)
                        self.assertTrue(o.retryable, o)
                        self.assertIsNotNone(o.retry_after, o)
                        self.assertGreater(o.retry_after, 0, o)
                self.assertTrue(busy, "6 steps at once over one slot and a 1 s bound: none refused")
        asyncio.run(main())


if __name__ == "__main__":
    unittest.main()
