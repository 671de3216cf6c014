"""Pipelined msgpack-rpc over a websocket (Arbor protocol v1 framing).

request      [0, msgid, method, [params]]
response     [1, msgid, error_or_nil, result_or_nil]
notification [2, method, [params]]

Responses may arrive in any order; each is matched to its request by msgid.
"""

import asyncio
import itertools

import msgpack

from ._errors import ArborError, ConnectionClosedError

try:  # websockets >= 13 has the new asyncio implementation
    from websockets.asyncio.client import connect as _ws_connect

    _HEADERS_KW = "additional_headers"
except ImportError:  # websockets 10-12 (Debian 12 ships 10.4)
    from websockets import connect as _ws_connect

    _HEADERS_KW = "extra_headers"

REQUEST, RESPONSE, NOTIFICATION = 0, 1, 2

# Frames can be large: a step_batch of 64 results with 256 KiB outputs.
MAX_FRAME = 256 << 20


def pack(obj):
    return msgpack.packb(obj, use_bin_type=True)


def unpack(data):
    # raw=False: msgpack str -> Python str, bin -> bytes.
    return msgpack.unpackb(data, raw=False, strict_map_key=False, use_list=True)


def error_from_wire(err):
    """Turns a response's error object into an ArborError."""
    if isinstance(err, dict):
        return ArborError(
            str(err.get("code", "internal")),
            str(err.get("message", "")),
            bool(err.get("retryable", False)),
            infra=bool(err.get("infra", False)),
        )
    return ArborError("internal", repr(err), False, infra=True)


class Connection:
    """One websocket carrying many requests at once. Use from one event loop."""

    def __init__(self, ws):
        self._ws = ws
        self._ids = itertools.count(1)
        self._pending = {}  # msgid -> Future
        self._watchers = {}  # msgid -> callable(params) for notifications of that request
        self._listeners = []  # callables(method, params) for other notifications
        self._send_lock = asyncio.Lock()
        self._closed = None  # the ArborError every later call gets
        self._reader = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def open(cls, url, token=None, open_timeout=10.0):
        headers = {"Authorization": "Bearer " + token} if token else None
        kw = {_HEADERS_KW: headers, "max_size": MAX_FRAME, "compression": None, "open_timeout": open_timeout}
        try:
            ws = await _ws_connect(url, **kw)
        except Exception as e:  # refused, bad handshake (401), DNS, ...
            raise ConnectionClosedError("connect to %s: %s" % (url, e)) from e
        return cls(ws)

    def add_listener(self, fn):
        """fn(method, params) is called for notifications not tied to a pending request."""
        self._listeners.append(fn)

    async def call(self, method, params=None, on_notify=None):
        """Sends one request and waits for its response; on_notify(params)
        receives the notifications that carry this request's msgid."""
        if self._closed is not None:
            raise self._closed
        msgid = next(self._ids) & 0xFFFFFFFF
        fut = asyncio.get_running_loop().create_future()
        self._pending[msgid] = fut
        if on_notify is not None:
            self._watchers[msgid] = on_notify
        try:
            frame = pack([REQUEST, msgid, method, [params if params is not None else {}]])
            async with self._send_lock:
                try:
                    await self._ws.send(frame)
                except Exception as e:
                    self._fail(ConnectionClosedError("send %s: %s" % (method, e)))
            return await fut
        finally:
            self._pending.pop(msgid, None)
            self._watchers.pop(msgid, None)

    async def _read(self):
        reason = "connection closed by the server"
        try:
            async for data in self._ws:
                if isinstance(data, str):
                    data = data.encode()
                try:
                    msg = unpack(data)
                except Exception as e:
                    reason = "undecodable frame from server: %s" % e
                    break
                self._dispatch(msg)
        except Exception as e:
            reason = "connection lost: %s" % e
        self._fail(ConnectionClosedError(reason))

    def _dispatch(self, msg):
        if not isinstance(msg, list) or not msg:
            return
        kind = msg[0]
        if kind == RESPONSE and len(msg) == 4:
            _, msgid, err, result = msg
            fut = self._pending.get(msgid)
            if fut is None or fut.done():
                return  # a response to a request we stopped waiting for
            if err is not None:
                fut.set_exception(error_from_wire(err))
            else:
                fut.set_result(result)
        elif kind == NOTIFICATION and len(msg) == 3:
            _, method, params = msg
            p = params[0] if isinstance(params, list) and params else params
            watcher = self._watchers.get(p.get("msgid")) if isinstance(p, dict) else None
            if watcher is not None:
                watcher(p)
                return
            for fn in list(self._listeners):
                fn(method, p)

    def _fail(self, err):
        if self._closed is None:
            self._closed = err
        for fut in list(self._pending.values()):
            if not fut.done():
                fut.set_exception(err)

    async def close(self):
        self._fail(ConnectionClosedError("connection closed by the client"))
        try:
            await self._ws.close()
        finally:
            self._reader.cancel()
            try:
                await self._reader
            except (asyncio.CancelledError, Exception):
                pass
