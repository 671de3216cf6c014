import asyncio
import queue
import threading
from typing import Any, Callable, Coroutine, Dict, Iterator, List, Optional, Sequence, Tuple, TypeVar, Union

from ._async import _DEFAULT, Action, AsyncClient, AsyncEnv, Outcome, StepTuple
from ._episode import AsyncEpisode, Trajectory
from ._errors import ArborError, BranchError
from ._pool import AsyncEnvPool, PoolResult
from ._runner import AgentResult, ChatClient, run_agent

T = TypeVar("T")


class _Loop:
    """An event loop on a daemon thread that sync calls are run on."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="arbor-client", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self.loop.is_closed():
            coro.close()
            raise ArborError("connection_closed", "the client is closed")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
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

    timeout (seconds, None: wait forever) bounds each call on the client
    side (every method also takes its own timeout=). A call that times out
    raises ClientTimeoutError; it is retryable only when repeating it is
    safe (for a step: with its request_key). reconnect, reconnect_timeout,
    origin, max_in_flight, busy_retries and busy_max_wait (the back-off
    on a busy server): as AsyncClient's.
    """

    def __init__(self, url: str, token: Optional[str] = None, timeout: Optional[float] = None,
                 open_timeout: float = 10.0, reconnect: bool = True, reconnect_timeout: float = 30.0,
                 origin: Optional[str] = None, max_in_flight: Optional[int] = None,
                 busy_retries: int = 20, busy_max_wait: float = 60.0) -> None:
        self._a = AsyncClient(url, token, open_timeout, timeout=timeout, reconnect=reconnect,
                              reconnect_timeout=reconnect_timeout, origin=origin, max_in_flight=max_in_flight,
                              busy_retries=busy_retries, busy_max_wait=busy_max_wait)
        self._loop = _Loop()
        self._closed = False
        try:
            self._run(self._a.connect())
        except BaseException:
            self._loop.stop()
            raise

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._loop.run(coro)

    @property
    def version(self) -> Optional[int]:
        return self._a.version

    @property
    def capabilities(self) -> Dict[str, Any]:
        return self._a.capabilities

    @property
    def max_in_flight(self) -> Optional[int]:
        """The cap on requests outstanding in effect (see AsyncClient)."""
        return self._a.max_in_flight

    @property
    def reconnects(self) -> int:
        """How many times the client opened a new connection after one dropped."""
        return self._a.reconnects

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Closes the connection and the client's thread; again, it does nothing."""
        if self._closed:
            return
        self._closed = True
        try:
            self._run(self._a.close())
        finally:
            self._loop.stop()

    def call(self, method: str, params: Optional[dict] = None, on_notify: Optional[Callable[[dict], None]] = None,
             timeout: Any = _DEFAULT, idempotent: Optional[bool] = None) -> Any:
        """Raw protocol call: returns the result or raises ArborError.
        on_notify runs on the client's thread."""
        return self._run(self._a.call(method, params, on_notify, timeout=timeout, idempotent=idempotent))

    def hello(self) -> Dict[str, Any]:
        return self._run(self._a.hello())

    def on_notification(self, fn: Callable[[str, Any], None]) -> None:
        """fn(method, params), on the client's thread, receives notifications not tied to a request."""
        self._a.on_notification(fn)

    def env(self, task: Optional[str] = None, image: Optional[str] = None, seed: Optional[int] = None,
            options: Optional[dict] = None, dataset: Optional[str] = None,
            index: Optional[int] = None) -> "Env":
        """An Env for a task, an image, or a dataset's instance; reset() starts it."""
        return Env(self, AsyncEnv(self._a, task=task, image=image, seed=seed, options=options,
                                  dataset=dataset, index=index))

    def tasks(self, dataset: Optional[str] = None, cursor: Optional[str] = None,
              limit: Optional[int] = None, timeout: Any = _DEFAULT) -> Dict[str, Any]:
        """See AsyncClient.tasks."""
        return self._run(self._a.tasks(dataset, cursor, limit, timeout=timeout))

    def make(self, task: Optional[str] = None, image: Optional[str] = None, seed: Optional[int] = None,
             options: Optional[dict] = None) -> Tuple["Env", Dict[str, Any], Dict[str, Any]]:
        """env(...) and reset() in one: returns (env, obs, info)."""
        env = self.env(task=task, image=image, seed=seed, options=options)
        obs, info = env.reset()
        return env, obs, info

    def attach(self, env_id: str, timeout: Any = _DEFAULT) -> "Env":
        """An Env for an env id the server has open (see AsyncClient.attach)."""
        return Env(self, self._run(self._a.attach(env_id, timeout=timeout)))

    def branch_state(self, state_id: str, n: int, allow_partial: bool = False,
                     timeout: Any = _DEFAULT) -> List[Optional["Env"]]:
        return self._wrap_children(self._a.branch_state(state_id, n, allow_partial, timeout=timeout))

    def prepare(self, state_ids: Sequence[str], n: int, wait: bool = False,
                timeout: Any = _DEFAULT) -> Dict[str, Any]:
        """See AsyncClient.prepare."""
        return self._run(self._a.prepare(state_ids, n, wait, timeout=timeout))

    def trajectory(self, state_id: str, timeout: Any = _DEFAULT) -> Dict[str, Any]:
        """See AsyncClient.trajectory."""
        return self._run(self._a.trajectory(state_id, timeout=timeout))

    def _wrap(self, a: Optional[AsyncEnv]) -> Optional["Env"]:
        if a is None:
            return None
        e = Env(self, a)
        return e

    def _wrap_children(self, coro: Coroutine[Any, Any, List[Optional[AsyncEnv]]]) -> List[Optional["Env"]]:
        try:
            return [self._wrap(a) for a in self._run(coro)]
        except BranchError as e:
            e.envs = [self._wrap(a) for a in e.envs]
            raise

    def step_batch(self, items: Sequence[Tuple[Any, Action]], on_result: Optional[Callable[[int, Outcome], None]] = None,
                   timeout: Any = _DEFAULT) -> List[Outcome]:
        """Steps many envs in one request: items [(env_or_id, action)];
        returns step tuples (or ArborError) in request order. on_result
        (index, outcome) runs on the client's thread as items finish."""
        items = [(env._a if isinstance(env, Env) else env, action) for env, action in items]
        return self._run(self._a.step_batch(items, on_result, timeout=timeout))

    def envs(self, timeout: Any = _DEFAULT) -> List[Dict[str, Any]]:
        return self._run(self._a.envs(timeout=timeout))

    def step_batch_iter(self, items: Sequence[Tuple[Any, Action]], timeout: Any = _DEFAULT) -> Iterator[Tuple[int, Outcome]]:
        """step_batch as a stream: yields (index, outcome) as items finish,
        first finishers first."""
        q: "queue.Queue[Any]" = queue.Queue()
        done = object()
        seen = set()

        def on_result(i: int, outcome: Outcome) -> None:
            q.put((i, outcome))

        items = [(env._a if isinstance(env, Env) else env, action) for env, action in items]

        async def run() -> None:
            try:
                final = await self._a.step_batch(items, on_result, timeout=timeout)
                for i, outcome in enumerate(final):
                    q.put((i, outcome))
                q.put(done)
            except BaseException as e:
                q.put(e)

        asyncio.run_coroutine_threadsafe(run(), self._loop.loop)
        while True:
            x = q.get()
            if x is done:
                return
            if isinstance(x, BaseException):
                raise x
            if x[0] not in seen:
                seen.add(x[0])
                yield x

    def pool(self, n: int, task: Optional[str] = None, image: Optional[str] = None, seed: Optional[int] = None,
             fork: bool = False) -> "EnvPool":
        """An EnvPool of n envs (see AsyncEnvPool.make)."""
        return EnvPool(self, self._run(AsyncEnvPool.make(self._a, n, task=task, image=image, seed=seed, fork=fork)))

    def run_episode(self, env: "Env", policy: Callable[[Dict[str, Any], Dict[str, Any]], Action],
                    max_turns: Optional[int] = None, reset: bool = True, seed: Optional[int] = None) -> Trajectory:
        """Runs policy(obs, info) -> action on this thread until the episode
        ends (see AsyncEpisode): returns the trajectory."""
        ep = Episode(env, max_turns=max_turns)
        if reset:
            try:
                obs, info = ep.reset(seed=seed)
            except ArborError as e:
                if not e.infra:
                    raise
                ep._a._mask(e)
                return ep.trajectory
        else:
            ep.start()
            obs, info = {}, {"state_id": env.state_id, "turn": env.turn}
        while not ep.done:
            obs, _, _, _, info = ep.step(policy(obs, info))
        return ep.trajectory


    def run_agent(self, env: "Env", chat: ChatClient, max_turns: Optional[int] = None, reset: bool = True,
                  seed: Optional[int] = None, fork_at: Optional[Dict[int, int]] = None,
                  tools: Optional[List[str]] = None) -> List[AgentResult]:
        """Runs a model behind an OpenAI-compatible endpoint as an agent on
        env (see arbor_env.run_agent): returns the trajectories."""
        return self._run(run_agent(env._a, chat, max_turns=max_turns, reset=reset, seed=seed, fork_at=fork_at, tools=tools))


class EnvPool:
    """Blocking twin of AsyncEnvPool: send(actions, env_ids) / recv(min_results, timeout)."""

    def __init__(self, client: Client, apool: AsyncEnvPool) -> None:
        self._c = client
        self._a = apool
        self.envs = [Env(client, e) for e in apool.envs]

    @property
    def env_ids(self) -> List[str]:
        return self._a.env_ids

    def send(self, actions: Sequence[Action], env_ids: Optional[Sequence[str]] = None, timeout: Any = _DEFAULT) -> None:
        async def send() -> None:
            self._a.send(actions, env_ids, timeout=timeout)
        self._c._run(send())

    def recv(self, min_results: Optional[int] = None, timeout: Optional[float] = None) -> List[PoolResult]:
        return self._c._run(self._a.recv(min_results, timeout))

    def close(self) -> None:
        self._c._run(self._a.close())

    def __enter__(self) -> "EnvPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Episode:
    """Blocking twin of AsyncEpisode."""

    def __init__(self, env: "Env", max_turns: Optional[int] = None, evaluate: bool = True) -> None:
        self._c = env._c
        self._a = AsyncEpisode(env._a, max_turns=max_turns, evaluate=evaluate)

    @property
    def done(self) -> bool:
        return self._a.done

    @property
    def trajectory(self) -> Trajectory:
        return self._a.trajectory

    @property
    def max_turns(self) -> Optional[int]:
        return self._a.max_turns

    def reset(self, seed: Optional[int] = None) -> Any:
        return self._c._run(self._a.reset(seed))

    def start(self) -> None:
        self._a.start()

    def step(self, action: Action) -> StepTuple:
        return self._c._run(self._a.step(action))


class Env:
    """Blocking twin of AsyncEnv; see there."""

    def __init__(self, client: Client, aenv: AsyncEnv) -> None:
        self._c = client
        self._a = aenv

    def __repr__(self) -> str:
        return repr(self._a).replace("AsyncEnv", "Env", 1)

    env_id = property(lambda self: self._a.env_id)
    state_id = property(lambda self: self._a.state_id)
    turn = property(lambda self: self._a.turn)
    task = property(lambda self: self._a.task)
    image = property(lambda self: self._a.image)
    closed = property(lambda self: self._a.closed)
    origin = property(lambda self: self._a.origin)
    done = property(lambda self: self._a.done, doc="terminated or truncated of the last step (see AsyncEnv)")
    submitted = property(lambda self: self._a.submitted)

    def reset(self, seed: Optional[int] = None, options: Optional[dict] = None,
              timeout: Any = _DEFAULT) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        return self._c._run(self._a.reset(seed, options, timeout=timeout))

    def step(self, action: Action, timeout_s: Optional[float] = None, key: Optional[str] = None,
             timeout: Any = _DEFAULT) -> StepTuple:
        return self._c._run(self._a.step(action, timeout_s, key=key, timeout=timeout))

    def submit(self, timeout: Any = _DEFAULT) -> StepTuple:
        """Ends the episode with the verifier's reward: see AsyncEnv.submit."""
        return self._c._run(self._a.submit(timeout=timeout))

    def write_file(self, path: str, content: Union[str, bytes], timeout: Any = _DEFAULT) -> StepTuple:
        return self._c._run(self._a.write_file(path, content, timeout=timeout))

    def read_file(self, path: str, timeout: Any = _DEFAULT) -> StepTuple:
        return self._c._run(self._a.read_file(path, timeout=timeout))

    def rollback_tool(self, state_id: str, timeout: Any = _DEFAULT) -> StepTuple:
        return self._c._run(self._a.rollback_tool(state_id, timeout=timeout))

    def branch(self, n: int, allow_partial: bool = False, timeout: Any = _DEFAULT) -> List[Optional["Env"]]:
        return self._c._wrap_children(self._a.branch(n, allow_partial, timeout=timeout))

    def checkpoint(self, timeout: Any = _DEFAULT) -> str:
        return self._c._run(self._a.checkpoint(timeout=timeout))

    def rollback(self, state_id: str, timeout: Any = _DEFAULT) -> Dict[str, Any]:
        return self._c._run(self._a.rollback(state_id, timeout=timeout))

    def evaluate(self, fork: bool = True, timeout: Any = _DEFAULT) -> Tuple[float, Dict[str, Any]]:
        return self._c._run(self._a.evaluate(fork=fork, timeout=timeout))

    def finish(self, timeout: Any = _DEFAULT) -> Tuple[float, Dict[str, Any]]:
        return self._c._run(self._a.finish(timeout=timeout))

    def promote(self, timeout: Any = _DEFAULT) -> Optional[str]:
        return self._c._run(self._a.promote(timeout=timeout))

    def discard(self, timeout: Any = _DEFAULT) -> None:
        return self._c._run(self._a.discard(timeout=timeout))

    def states(self, timeout: Any = _DEFAULT) -> List[Dict[str, Any]]:
        return self._c._run(self._a.states(timeout=timeout))

    def trajectory(self, timeout: Any = _DEFAULT) -> Dict[str, Any]:
        """See AsyncEnv.trajectory."""
        return self._c._run(self._a.trajectory(timeout=timeout))

    def close(self, timeout: Any = _DEFAULT) -> None:
        return self._c._run(self._a.close(timeout=timeout))

    def __enter__(self) -> "Env":
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.close()
        except ArborError:
            if exc[0] is None:
                raise
