"""A websocket proxy in front of a real `arbor serve`, for fault injection.

Every client connection gets its own upstream connection (with the
client's Authorization and Origin headers); frames are pumped both ways.
Hooks, all usable from the test's thread:

- transform(msg) -> msg: applied to each decoded server-to-client frame
  (return None to drop it); raw bytes may be returned to send as they are.
- inject(data): sends raw bytes to every connected client.
- drop(): cuts every connection (client and upstream sides) without a
  close handshake; new connections are accepted as before.
- closes: the close codes the clients' sides ended with.
- peak_in_flight: the most requests that were outstanding at once on one
  connection (sent by the client, their response not yet passed back).
"""

import asyncio

import msgpack
import websockets

from .loopserver import LoopServer

try:
    from websockets.asyncio.client import connect as _connect

    _HEADERS = "additional_headers"
except ImportError:
    from websockets import connect as _connect

    _HEADERS = "extra_headers"


class Proxy(LoopServer):
    def __init__(self, upstream):
        self.upstream = upstream
        self.transform = None
        self.closes = []
        self.connections = 0
        self.requests = []  # decoded client-to-server frames
        self.peak_in_flight = 0
        self._clients = set()
        super().__init__(self._handle, max_size=None)

    def inject(self, data):
        async def send():
            for ws, _ in list(self._clients):
                await ws.send(data)
        self.do(send())

    def drop(self):
        async def cut():
            for ws, up in list(self._clients):
                ws.transport.abort()
                up.transport.abort()
        self.do(cut())

    async def _handle(self, ws, path=None):
        req = getattr(ws, "request", None)
        headers = req.headers if req is not None else ws.request_headers
        fwd = {k: headers[k] for k in ("Authorization", "Origin") if k in headers}
        kw = {_HEADERS: fwd or None, "max_size": None, "compression": None}
        if "Origin" in fwd:
            kw["origin"] = fwd.pop("Origin")
        up = await _connect(self.upstream, **kw)
        self.connections += 1
        pair = (ws, up)
        self._clients.add(pair)
        outstanding = set()

        async def down():
            async for data in up:
                out = data
                try:
                    m = msgpack.unpackb(data, raw=False)
                    if isinstance(m, list) and m and m[0] == 1:
                        outstanding.discard(m[1])
                except Exception:
                    pass
                if self.transform is not None:
                    msg = self.transform(msgpack.unpackb(data, raw=False))
                    if msg is None:
                        continue
                    out = msg if isinstance(msg, bytes) else msgpack.packb(msg, use_bin_type=True)
                await ws.send(out)

        async def upward():
            async for data in ws:
                try:
                    m = msgpack.unpackb(data, raw=False)
                    self.requests.append(m)
                    if isinstance(m, list) and m and m[0] == 0:
                        outstanding.add(m[1])
                        self.peak_in_flight = max(self.peak_in_flight, len(outstanding))
                except Exception:
                    pass
                await up.send(data)

        tasks = [asyncio.ensure_future(down()), asyncio.ensure_future(upward())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._clients.discard(pair)
            self.closes.append(ws.close_code)
            up.transport.abort()
            try:
                await asyncio.wait_for(ws.close(), 2)
            except Exception:
                pass
