"""A websocket server on 127.0.0.1 (a free port) run by its own asyncio loop
in a thread, for the tests' fake server and fault-injecting proxy."""

import asyncio
import threading

import websockets


class LoopServer:
    """Starts serving handler at construction; url is its /v1/ws. do(coro)
    runs a coroutine on the server's loop from the test's thread; stop()
    closes the server, cancels what still runs and ends the thread."""

    def __init__(self, handler, **serve_kwargs):
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        def main():
            asyncio.set_event_loop(self.loop)

            async def start():
                self.server = await websockets.serve(handler, "127.0.0.1", 0, compression=None, **serve_kwargs)
                self.port = list(self.server.sockets)[0].getsockname()[1]
                ready.set()

            self.loop.run_until_complete(start())
            self.loop.run_forever()

        self.thread = threading.Thread(target=main, daemon=True)
        self.thread.start()
        ready.wait(10)
        self.url = "ws://127.0.0.1:%d/v1/ws" % self.port

    def do(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def stop(self):
        async def shut():
            self.server.close()
            await self.server.wait_closed()
            rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in rest:
                t.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        self.do(shut())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
