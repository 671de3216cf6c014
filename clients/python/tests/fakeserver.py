"""A tiny protocol-v1 websocket server for testing the client's framing."""

import asyncio

import msgpack
import websockets

from .loopserver import LoopServer


class FakeServer(LoopServer):
    """Serves on 127.0.0.1 (a free port) from its own thread. frames holds
    every decoded request; headers the last handshake's headers."""

    def __init__(self, token=None, capabilities=None):
        self.token = token
        self.capabilities = capabilities or {"methods": ["hello"]}
        self.in_flight = 0
        self.evaluate_result = {"reward": 1, "details": {"exit_code": 0}}
        self.step_extra = {}
        self.max_seen_in_flight = 0
        self.frames = []
        self.headers = {}
        super().__init__(self._handle)

    async def _handle(self, ws, path=None):
        req = getattr(ws, "request", None)
        self.headers = req.headers if req is not None else ws.request_headers
        lock = asyncio.Lock()

        async def send(obj):
            async with lock:
                await ws.send(msgpack.packb(obj, use_bin_type=True))

        tasks = set()
        try:
            async for data in ws:
                msg = msgpack.unpackb(data, raw=False)
                self.frames.append(msg)
                t = asyncio.ensure_future(self._answer(ws, send, msg))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
        except websockets.ConnectionClosed:
            pass

    async def _answer(self, ws, send, msg):
        self.in_flight += 1
        self.max_seen_in_flight = max(self.max_seen_in_flight, self.in_flight)
        try:
            return await self._answer1(ws, send, msg)
        finally:
            self.in_flight -= 1

    async def _answer1(self, ws, send, msg):
        kind, msgid, method, params = msg
        p = params[0]

        def ok(result):
            return send([1, msgid, None, result])

        def err(code, message, retryable=False, infra=False):
            return send([1, msgid, {"code": code, "message": message, "retryable": retryable, "infra": infra}, None])

        if method == "hello":
            if self.token and p.get("token") != self.token:
                return await err("unauthorized", "bad token")
            return await ok({"version": 1, "server": "fake", "capabilities": self.capabilities})
        if method == "garbage":
            async with asyncio.Lock():
                await ws.send(b"\xc1 not msgpack")
            return
        if method == "short":
            return await send([1, msgid, None])
        if method == "noid":
            return await send([1, "x", None, {}])
        if method == "sleep":
            await asyncio.sleep(p["ms"] / 1000)
            return await ok({"tag": p["tag"]})
        if method == "reset":
            return await ok({"env_id": "e1", "obs": {"stdout": "", "instruction": "do it"},
                             "info": {"state_id": "s1", "turn": 0, "image": "busybox", "task": p.get("task")}})
        if method == "step":
            a = p["action"]
            res = {"obs": {"stdout": a.get("cmd") or a.get("content")}, "reward": 0.5, "terminated": False,
                   "truncated": True, "info": {"state_id": "s2", "turn": 1}}
            res.update(self.step_extra)
            return await ok({k: v for k, v in res.items() if v is not None})
        if method == "branch":
            n = p["n"]
            ids = ["c%d" % i for i in range(n)]
            if n == 3:
                ids[1] = ""
                return await ok({"env_ids": ids, "state_id": "s2",
                                 "errors": [None, {"code": "restore_failed", "message": "criu", "retryable": True, "infra": True}, None]})
            return await ok({"env_ids": ids, "state_id": "s2"})
        if method == "evaluate":
            return await ok(self.evaluate_result)
        if method == "close":
            return await ok({})
        if method == "fail":
            return await err("unknown_env", "no env x", False)
        if method == "step_batch":
            items = p["items"]
            results = []
            for i in reversed(range(len(items))):
                if items[i]["env_id"] == "bad":
                    r = {"msgid": msgid, "index": i, "env_id": "bad", "error": {"code": "unknown_env", "message": "bad", "retryable": False}}
                else:
                    r = {"msgid": msgid, "index": i, "env_id": items[i]["env_id"],
                         "result": {"obs": {"stdout": items[i]["action"]["cmd"]}, "reward": 0, "terminated": False,
                                    "truncated": False, "info": {"state_id": "b%d" % i, "turn": 1}}}
                await send([2, "step_batch", [r]])
                results.append(r)
            return await ok({"results": sorted(results, key=lambda r: r["index"])})
        if method == "notify_other":
            await send([2, "error", [{"code": "malformed", "message": "elsewhere"}]])
            return await ok({})
        if method == "hangup":
            await ws.close()
            return
        return await err("unknown_method", method)
