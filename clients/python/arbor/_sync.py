import asyncio
import concurrent.futures
import threading

from ._async import AsyncClient, AsyncEnv
from ._errors import ArborError, BranchError


class _Loop:
    """An event loop on a daemon thread that sync calls are run on."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="arbor-client", daemon=True)
        self.thread.start()

    def run(self, coro, timeout=None):
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise ArborError("client_timeout", "no answer within %ss" % timeout, retryable=True, infra=True) from None

    def stop(self):
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


class Client:
    """Blocking client of an Arbor server. It is safe to use from many
    threads at once: their requests are pipelined on one websocket.

        with Client("ws://127.0.0.1:7878/v1/ws") as c:
            env = c.env(task="hello")
            obs, info = env.reset()
            obs, reward, terminated, truncated, info = env.step("ls")

    timeout (seconds, None: wait forever) bounds each call on the client side.
    """

    def __init__(self, url, token=None, timeout=None, open_timeout=10.0):
        self._loop = _Loop()
        self._timeout = timeout
        self._a = AsyncClient(url, token, open_timeout)
        try:
            self._run(self._a.connect())
        except BaseException:
            self._loop.stop()
            raise

    def _run(self, coro):
        return self._loop.run(coro, self._timeout)

    @property
    def version(self):
        return self._a.version

    @property
    def capabilities(self):
        return self._a.capabilities

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        try:
            self._loop.run(self._a.close(), 10)
        finally:
            self._loop.stop()

    def call(self, method, params=None, on_notify=None):
        """Raw protocol call: returns the result or raises ArborError.
        on_notify runs on the client's thread."""
        return self._run(self._a.call(method, params, on_notify))

    def hello(self):
        return self._run(self._a.hello())

    def env(self, task=None, image=None, seed=None, options=None):
        """An Env for a task or an image; reset() starts it."""
        return Env(self, AsyncEnv(self._a, task=task, image=image, seed=seed, options=options))

    def make(self, task=None, image=None, seed=None, options=None):
        """env(...) and reset() in one: returns (env, obs, info)."""
        env = self.env(task=task, image=image, seed=seed, options=options)
        obs, info = env.reset()
        return env, obs, info

    def branch_state(self, state_id, n, allow_partial=False):
        return self._wrap_children(self._a.branch_state(state_id, n, allow_partial))

    def _wrap_children(self, coro):
        try:
            return [Env(self, a) if a is not None else None for a in self._run(coro)]
        except BranchError as e:
            e.envs = [Env(self, a) if a is not None else None for a in e.envs]
            raise

    def step_batch(self, items, on_result=None):
        """Steps many envs in one request: items [(env_or_id, action)];
        returns step tuples (or ArborError) in request order. on_result
        (index, outcome) runs on the client's thread as items finish."""
        items = [(env._a if isinstance(env, Env) else env, action) for env, action in items]
        return self._run(self._a.step_batch(items, on_result))

    def envs(self):
        return self._run(self._a.envs())


class Env:
    """Blocking twin of AsyncEnv; see there."""

    def __init__(self, client, aenv):
        self._c = client
        self._a = aenv

    def __repr__(self):
        return repr(self._a).replace("AsyncEnv", "Env", 1)

    env_id = property(lambda self: self._a.env_id)
    state_id = property(lambda self: self._a.state_id)
    turn = property(lambda self: self._a.turn)
    task = property(lambda self: self._a.task)
    image = property(lambda self: self._a.image)
    closed = property(lambda self: self._a.closed)

    def reset(self, seed=None, options=None):
        return self._c._run(self._a.reset(seed, options))

    def step(self, action, timeout_s=None):
        return self._c._run(self._a.step(action, timeout_s))

    def write_file(self, path, content):
        return self._c._run(self._a.write_file(path, content))

    def read_file(self, path):
        return self._c._run(self._a.read_file(path))

    def rollback_tool(self, state_id):
        return self._c._run(self._a.rollback_tool(state_id))

    def branch(self, n, allow_partial=False):
        return self._c._wrap_children(self._a.branch(n, allow_partial))

    def checkpoint(self):
        return self._c._run(self._a.checkpoint())

    def rollback(self, state_id):
        return self._c._run(self._a.rollback(state_id))

    def evaluate(self):
        return self._c._run(self._a.evaluate())

    def promote(self):
        return self._c._run(self._a.promote())

    def discard(self):
        return self._c._run(self._a.discard())

    def states(self):
        return self._c._run(self._a.states())

    def close(self):
        return self._c._run(self._a.close())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            self.close()
        except ArborError:
            pass
