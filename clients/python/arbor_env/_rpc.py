"""Pipelined msgpack-rpc over a websocket (Arbor protocol v1 framing).

request      [0, msgid, method, [params]]
response     [1, msgid, error_or_nil, result_or_nil]
notification [2, method, [params]]

Responses may arrive in any order; each is matched to its request by msgid.
"""

import asyncio
import itertools
import logging
from typing import Any, Callable, Dict, List, Optional

import msgpack

from ._errors import ArborError, BadResponseError, BadURLError, ClientTimeoutError, ConnectionClosedError

try:  # websockets >= 13 has the new asyncio implementation
    from websockets.asyncio.client import connect as _ws_connect

    _HEADERS_KW = "additional_headers"
except ImportError:  # websockets 10-12 (Debian 12 ships 10.4)
    from websockets import connect as _ws_connect  # type: ignore[no-redef]

    _HEADERS_KW = "extra_headers"

log = logging.getLogger("arbor_env")

REQUEST, RESPONSE, NOTIFICATION = 0, 1, 2

# Frames can be large: a step_batch of 64 results with 256 KiB outputs.
MAX_FRAME = 256 << 20


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def unpack(data: bytes) -> Any:
    # raw=False: msgpack str -> Python str, bin -> bytes.
    return msgpack.unpackb(data, raw=False, strict_map_key=False, use_list=True)


def error_from_wire(err: Any) -> ArborError:
    """Turns a response's error object into an ArborError."""
    if isinstance(err, dict):
        after = err.get("retry_after_ms")
        return ArborError(
            str(err.get("code", "internal")),
            str(err.get("message", "")),
            bool(err.get("retryable", False)),
            infra=bool(err.get("infra", False)),
            retry_after=after / 1000.0 if isinstance(after, (int, float)) and not isinstance(after, bool) and after > 0 else None,
        )
    return BadResponseError("error object is not a map: %r" % (err,))


def _not_an_endpoint(e: Exception) -> Optional[str]:
    """Why a failed websocket handshake says the URL is wrong, or None
    when it may work later. A server that answers with a status that
    rejects the request itself (404 and the other 4xx but 401, 403, 408
    and 429) or with a page instead of an upgrade (1xx-3xx) is no v1
    endpoint at that path; 5xx, timeouts, 401/403 and 429 may pass."""
    if type(e).__name__ == "InvalidURI":
        return "not a websocket URL (%s)" % e
    status = getattr(e, "status_code", None)  # websockets < 14 (InvalidStatusCode)
    if status is None:
        status = getattr(getattr(e, "response", None), "status_code", None)  # InvalidStatus
    if not isinstance(status, int):
        return None
    if status < 400 or (status < 500 and status not in (401, 403, 408, 429)):
        return "the server answered HTTP %d instead of a websocket upgrade (a wrong path, or no Arbor server there)" % status
    return None


class Connection:
    """One websocket carrying many requests at once. Use from one event loop.

    max_in_flight (from hello's limits, set_max_in_flight) caps the requests
    outstanding: more wait on the client instead of being refused by the
    server with too_many_requests."""

    def __init__(self, ws: Any) -> None:
        self._ws = ws
        self._ids = itertools.count(1)
        self._pending: Dict[int, asyncio.Future] = {}
        self._watchers: Dict[int, Callable[[dict], None]] = {}
        self._cb_errors: Dict[int, BaseException] = {}
        self._listeners: List[Callable[[str, Any], None]] = []
        self._send_lock = asyncio.Lock()
        self._slots: Optional[asyncio.Semaphore] = None
        self._closed: Optional[ConnectionClosedError] = None  # why the connection ended
        self.closed_event = asyncio.Event()
        self._reader = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def open(cls, url: str, token: Optional[str] = None, open_timeout: float = 10.0,
                   origin: Optional[str] = None) -> "Connection":
        headers = {"Authorization": "Bearer " + token} if token else None
        kw: Dict[str, Any] = {_HEADERS_KW: headers, "max_size": MAX_FRAME, "compression": None,
                              "open_timeout": open_timeout}
        if origin is not None:
            kw["origin"] = origin
        if not url.startswith(("ws://", "wss://")):
            raise BadURLError(url, "the scheme is not ws:// or wss://")
        try:
            ws = await _ws_connect(url, **kw)
        except Exception as e:
            bad = _not_an_endpoint(e)
            if bad is not None:
                raise BadURLError(url, bad) from e
            # refused, DNS, a proxy's 502/503, a forbidden Origin (403), ...
            raise ConnectionClosedError("connect to %s: %s" % (url, e)) from e
        return cls(ws)

    @property
    def closed(self) -> Optional[ConnectionClosedError]:
        """None while open; else the error calls get."""
        return self._closed

    def set_max_in_flight(self, n: Optional[int]) -> None:
        if n and n > 0:
            self._slots = asyncio.Semaphore(int(n))

    def add_listener(self, fn: Callable[[str, Any], None]) -> None:
        """fn(method, params) is called for notifications not tied to a pending request."""
        self._listeners.append(fn)

    async def call(self, method: str, params: Optional[dict] = None,
                   on_notify: Optional[Callable[[dict], None]] = None,
                   timeout: Optional[float] = None, idempotent: bool = False,
                   request_key: Optional[str] = None) -> Any:
        """Sends one request and waits for its response; on_notify(params)
        receives the notifications that carry this request's msgid. An
        exception raised by on_notify is raised by this call once its
        answer is in; the connection and other calls go on.

        timeout bounds the wait (the request may still run on the server:
        the ClientTimeoutError is retryable only when idempotent)."""
        if self._closed is not None:
            raise ConnectionClosedError(self._closed.message, retryable=True, sent=False)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        slots = self._slots
        if slots is not None:
            try:
                await asyncio.wait_for(slots.acquire(), timeout)
            except asyncio.TimeoutError:
                raise ClientTimeoutError("%s: not sent within %ss (max_in_flight requests outstanding)" % (method, timeout),
                                         retryable=True, request_key=request_key) from None
        msgid = next(self._ids) & 0xFFFFFFFF
        try:
            fut = loop.create_future()
            self._pending[msgid] = fut
            if on_notify is not None:
                self._watchers[msgid] = on_notify
            frame = pack([REQUEST, msgid, method, [params if params is not None else {}]])
            async with self._send_lock:
                if self._closed is not None:
                    raise ConnectionClosedError(self._closed.message, retryable=True, sent=False)
                try:
                    await self._ws.send(frame)
                except asyncio.CancelledError:
                    raise
                except Exception as e:
                    self._fail(ConnectionClosedError("send %s: %s" % (method, e)))
            wait = None if deadline is None else max(0.0, deadline - loop.time())
            try:
                result = await asyncio.wait_for(asyncio.shield(fut), wait)
            except asyncio.TimeoutError:
                if idempotent:
                    msg = "%s: no answer within %ss; it may still run on the server, and repeating it is safe" % (method, timeout)
                else:
                    msg = ("%s: no answer within %ss; it may still run (or have run) on the server, so repeating it "
                           "is not safe%s" % (method, timeout, " (give a step a request key to make it so)" if method == "step" else ""))
                raise ClientTimeoutError(msg, retryable=idempotent, request_key=request_key) from None
            except ConnectionClosedError as e:
                raise ConnectionClosedError(e.message + ("; %s was sent and %s" % (
                    method, "is safe to repeat" if idempotent else "may have run on the server")),
                    retryable=idempotent, sent=True) from None
            cb_err = self._cb_errors.pop(msgid, None)
            if cb_err is not None:
                raise cb_err
            return result
        finally:
            self._pending.pop(msgid, None)
            self._watchers.pop(msgid, None)
            self._cb_errors.pop(msgid, None)
            if slots is not None:
                slots.release()

    async def _read(self) -> None:
        reason = "connection closed by the server"
        try:
            async for data in self._ws:
                if isinstance(data, str):
                    data = data.encode()
                try:
                    msg = unpack(data)
                except Exception as e:
                    await self._abort("undecodable frame from the server (%s): %r" % (e, bytes(data[:32])))
                    return
                bad = self._dispatch(msg)
                if bad is not None:
                    await self._abort(bad)
                    return
        except asyncio.CancelledError:
            raise
        except Exception as e:
            reason = "connection lost: %s" % e
        finally:
            self._fail(ConnectionClosedError(reason))

    async def _abort(self, reason: str) -> None:
        """Ends the connection on a frame that breaks the protocol: every
        pending call fails with reason, and the socket is closed (1002,
        protocol error) rather than left open with callers waiting."""
        log.warning("arbor_env: closing the connection: %s", reason)
        self._fail(ConnectionClosedError(reason))
        try:
            await asyncio.wait_for(self._ws.close(1002, "protocol error"), 5)
        except Exception:
            pass

    def _dispatch(self, msg: Any) -> Optional[str]:
        """Delivers one frame; returns why the connection must end when it
        cannot be attributed to a request (a caller would wait forever)."""
        if not isinstance(msg, list) or not msg:
            return "frame from the server is not a msgpack-rpc array: %r" % (msg,)
        kind = msg[0]
        if kind == RESPONSE:
            msgid = msg[1] if len(msg) > 1 else None
            if not isinstance(msgid, int) or isinstance(msgid, bool):
                return "response without a msgid: %r" % (msg[:4],)
            fut = self._pending.get(msgid)
            if fut is None or fut.done():
                return None  # a response to a request we stopped waiting for
            if len(msg) != 4:
                fut.set_exception(BadResponseError("response to msgid %d has %d elements, want 4: %r" % (msgid, len(msg), msg[:4])))
                return None
            _, _, err, result = msg
            if err is not None:
                fut.set_exception(error_from_wire(err))
            else:
                fut.set_result(result)
            return None
        if kind == NOTIFICATION:
            if len(msg) != 3 or not isinstance(msg[1], str):
                log.warning("arbor_env: ignored a malformed notification %r", msg[:3])
                return None
            _, method, params = msg
            p = params[0] if isinstance(params, list) and params else params
            mid = p.get("msgid") if isinstance(p, dict) else None
            watcher = self._watchers.get(mid) if isinstance(mid, int) else None
            if watcher is not None:
                try:
                    watcher(p)
                except Exception as e:  # the caller's bug: its call raises it
                    self._cb_errors.setdefault(mid, e)
                return None
            for fn in list(self._listeners):
                try:
                    fn(method, p)
                except Exception:
                    log.exception("arbor_env: notification listener %r raised", fn)
            return None
        return "frame of unknown type %r from the server" % (kind,)

    def _fail(self, err: ConnectionClosedError) -> None:
        if self._closed is None:
            self._closed = err
        self.closed_event.set()
        for fut in list(self._pending.values()):
            if not fut.done():
                fut.set_exception(self._closed)

    async def close(self) -> None:
        self._fail(ConnectionClosedError("connection closed by the client"))
        try:
            await asyncio.wait_for(self._ws.close(), 10)
        except Exception:
            pass
        finally:
            if not self._reader.done():
                self._reader.cancel()
            # wait, not await: the reader's own end (cancelled or not) is
            # not this caller's, and a cancellation of this caller must
            # reach it.
            await asyncio.wait([self._reader])
