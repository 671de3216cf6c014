"""EnvPool-style batching: send steps to many envs, receive the first finishers."""

import asyncio
from typing import Any, AsyncIterator, Dict, List, NamedTuple, Optional, Sequence, Tuple

from ._async import _DEFAULT, Action, AsyncClient, AsyncEnv, Outcome
from ._errors import ArborError


class PoolResult(NamedTuple):
    """One finished step of a pool: the Gymnasium tuple, or error (an
    ArborError; then obs and info are empty and reward None)."""

    env_id: str
    obs: Dict[str, Any]
    reward: Optional[float]
    terminated: bool
    truncated: bool
    info: Dict[str, Any]
    error: Optional[ArborError]


class AsyncEnvPool:
    """n envs of one task (or image) stepped asynchronously, EnvPool-style:

        pool = await AsyncEnvPool.make(client, 64, task="hello")
        pool.send(actions)                    # one action per env (or env_ids=)
        done = await pool.recv(min_results=16, timeout=5)   # the first finishers

    send never waits; recv returns once min_results steps have finished (all
    that have, at least min_results) or timeout seconds passed (whatever
    has finished, maybe none). Each env has at most one step in flight.
    Steps carry request keys (step_keys servers), so a dropped connection
    costs no step twice. The pool's envs are AsyncEnvs (pool.envs) and can
    be branched, evaluated or rolled back between steps.
    """

    def __init__(self, client: AsyncClient, envs: Sequence[AsyncEnv]) -> None:
        self.client = client
        self.envs: List[AsyncEnv] = list(envs)
        self._by_id: Dict[str, AsyncEnv] = {e.env_id: e for e in self.envs if e.env_id}
        self._busy: Dict[str, "asyncio.Task[Any]"] = {}
        self._done: "asyncio.Queue[PoolResult]" = asyncio.Queue()

    @classmethod
    async def make(cls, client: AsyncClient, n: int, task: Optional[str] = None, image: Optional[str] = None,
                   seed: Optional[int] = None, fork: bool = False) -> "AsyncEnvPool":
        """n envs reset from the task; fork: one reset and n-1 branch
        children of its first state (identical starts, ~ms each)."""
        if fork:
            first, _, _ = await client.make(task=task, image=image, seed=seed)
            kids = await first.branch(n - 1) if n > 1 else []
            return cls(client, [first] + [k for k in kids if k is not None])
        made = await asyncio.gather(*[client.make(task=task, image=image, seed=None if seed is None else seed + i)
                                      for i in range(n)], return_exceptions=True)
        envs = [m[0] for m in made if not isinstance(m, BaseException)]
        errs = [m for m in made if isinstance(m, BaseException)]
        if errs:
            await asyncio.gather(*[e.close() for e in envs], return_exceptions=True)
            raise errs[0]
        return cls(client, envs)

    @property
    def env_ids(self) -> List[str]:
        return [e.env_id for e in self.envs if e.env_id]

    def in_flight(self) -> int:
        return len(self._busy)

    def send(self, actions: Sequence[Action], env_ids: Optional[Sequence[str]] = None,
             timeout: Any = _DEFAULT) -> None:
        """Starts one step per (env, action); env_ids default to the pool's
        envs in order. An env that has a step in flight is refused
        (ValueError): recv its result first."""
        ids = list(env_ids) if env_ids is not None else self.env_ids[:len(actions)]
        if len(ids) != len(actions):
            raise ValueError("%d actions for %d envs" % (len(actions), len(ids)))
        for env_id in ids:
            if env_id not in self._by_id:
                raise ValueError("env %r is not in the pool" % env_id)
            if env_id in self._busy:
                raise ValueError("env %r has a step in flight: recv it first" % env_id)
        for env_id, action in zip(ids, actions):
            env = self._by_id[env_id]
            self._busy[env_id] = asyncio.ensure_future(self._step(env, action, timeout))

    async def _step(self, env: AsyncEnv, action: Action, timeout: Any) -> None:
        try:
            obs, reward, term, trunc, info = await env.step(action, timeout=timeout)
            r = PoolResult(env.env_id or "", obs, reward, term, trunc, info, None)
        except ArborError as e:
            r = PoolResult(env.env_id or "", {}, None, False, False, {}, e)
        finally:
            self._busy.pop(env.env_id or "", None)
        self._done.put_nowait(r)

    async def recv(self, min_results: Optional[int] = None, timeout: Optional[float] = None) -> List[PoolResult]:
        """The steps finished since the last recv, first finishers first:
        at least min_results of them (default: all in flight) unless
        timeout passes first."""
        want = (self.in_flight() + self._done.qsize()) if min_results is None else min_results
        out: List[PoolResult] = []
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while len(out) < want:
            if self._done.empty() and not self._busy:
                break  # nothing more can come
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                break
            try:
                out.append(await asyncio.wait_for(self._done.get(), left))
            except asyncio.TimeoutError:
                break
        while not self._done.empty():
            out.append(self._done.get_nowait())
        return out

    async def close(self) -> None:
        """Waits for the steps in flight and closes every env of the pool."""
        if self._busy:
            await asyncio.gather(*list(self._busy.values()), return_exceptions=True)
        await asyncio.gather(*[e.close() for e in self.envs], return_exceptions=True)

    async def __aenter__(self) -> "AsyncEnvPool":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


async def step_batch_stream(client: AsyncClient, items: Sequence[Tuple[Any, Action]],
                            timeout: Any = _DEFAULT) -> AsyncIterator[Tuple[int, Outcome]]:
    """step_batch as an async iterator of (index, outcome), first finishers
    first; the batch's own failure (a dropped connection that cannot be
    retried, ...) is raised after the items that finished."""
    q: "asyncio.Queue[Tuple[int, Outcome]]" = asyncio.Queue()
    seen = set()

    def on_result(i: int, outcome: Outcome) -> None:
        if i not in seen:
            seen.add(i)
            q.put_nowait((i, outcome))

    task = asyncio.ensure_future(client.step_batch(items, on_result=on_result, timeout=timeout))
    try:
        while len(seen) < len(items) or not q.empty():
            if q.empty() and task.done():
                break
            getter = asyncio.ensure_future(q.get())
            await asyncio.wait([getter, task], return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                yield getter.result()
            else:
                getter.cancel()
        final = await task
        for i, outcome in enumerate(final):  # items whose notification was lost
            if i not in seen:
                seen.add(i)
                yield i, outcome
    finally:
        if not task.done():
            task.cancel()
