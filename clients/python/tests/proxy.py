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
"""

import asyncio
import threading

import msgpack
import websockets

try:
    from websockets.asyncio.client import connect as _connect

    _HEADERS = "additional_headers"
except ImportError:
    from websockets import connect as _connect

    _HEADERS = "extra_headers"


class Proxy:
    def __init__(self, upstream):
        self.upstream = upstream
        self.transform = None
        self.closes = []
        self.connections = 0
        self.requests = []  # decoded client-to-server frames
        self._clients = set()
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self.thread = threading.Thread(target=self._main, args=(ready,), daemon=True)
        self.thread.start()
        ready.wait(10)
        self.url = "ws://127.0.0.1:%d/v1/ws" % self.port

    def _main(self, ready):
        asyncio.set_event_loop(self.loop)

        async def start():
            self.server = await websockets.serve(self._handle, "127.0.0.1", 0, compression=None, max_size=None)
            self.port = list(self.server.sockets)[0].getsockname()[1]
            ready.set()

        self.loop.run_until_complete(start())
        self.loop.run_forever()

    def _do(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def inject(self, data):
        async def send():
            for ws, _ in list(self._clients):
                await ws.send(data)
        self._do(send())

    def drop(self):
        async def cut():
            for ws, up in list(self._clients):
                ws.transport.abort()
                up.transport.abort()
        self._do(cut())

    def stop(self):
        async def shut():
            self.server.close()
            await self.server.wait_closed()
            rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in rest:
                t.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        self._do(shut())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

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

        async def down():
            async for data in up:
                out = data
                if self.transform is not None:
                    msg = self.transform(msgpack.unpackb(data, raw=False))
                    if msg is None:
                        continue
                    out = msg if isinstance(msg, bytes) else msgpack.packb(msg, use_bin_type=True)
                await ws.send(out)

        async def upward():
            async for data in ws:
                try:
                    self.requests.append(msgpack.unpackb(data, raw=False))
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
