import asyncio
import logging
import math
import random
import uuid
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Type, TypeVar, Union

from ._errors import ArborError, BadResponseError, BranchError, ConnectionClosedError
from ._rpc import Connection, error_from_wire

PROTOCOL_VERSION = 1

log = logging.getLogger("arbor_env")

Action = Union[str, Dict[str, Any]]
StepTuple = Tuple[Dict[str, Any], Optional[float], bool, bool, Dict[str, Any]]
Outcome = Union[StepTuple, ArborError]

# Methods whose repetition is harmless: a call of one that was sent but
# lost its answer to a dropped connection is sent again after the
# reconnect. A step is one only with a request key (step_keys servers).
IDEMPOTENT = frozenset(["hello", "envs", "states", "evaluate", "checkpoint", "rollback", "close",
                        "release", "pin", "unpin", "prepare", "trajectory"])

_DEFAULT = object()


def make_action(action: Action, timeout_s: Optional[float] = None) -> Dict[str, Any]:
    """A step action: a str is a bash command; a dict is passed as is
    ({"tool": "write_file", "path": ..., "content": ...} and so on)."""
    if isinstance(action, str):
        a: Dict[str, Any] = {"tool": "bash", "cmd": action}
    elif isinstance(action, dict):
        a = dict(action)
    else:
        raise TypeError("action must be a str (bash command) or a dict, not %s" % type(action).__name__)
    if timeout_s is not None:
        a["timeout_s"] = float(timeout_s)
    if isinstance(a.get("content"), str):
        a["content"] = a["content"].encode()
    return a


def new_key() -> str:
    """A fresh request key for an idempotent step."""
    return uuid.uuid4().hex


def _map(res: Any, what: str) -> Dict[str, Any]:
    if not isinstance(res, dict):
        raise BadResponseError("%s: result is %s, want a map" % (what, type(res).__name__))
    return res


def _field(res: Dict[str, Any], name: str, types: Any, what: str, required: bool = True) -> Any:
    v = res.get(name)
    if v is None and not required:
        return None
    if not isinstance(v, types):
        raise BadResponseError("%s: field %r is %r, want %s" % (what, name, v, getattr(types, "__name__", types)))
    return v


def step_tuple(res: Any, what: str = "step") -> StepTuple:
    """(obs, reward, terminated, truncated, info), as Gymnasium's step
    returns. reward is None when the server sent none (protocol v1 sends
    0 on every step: rewards come from evaluate); a missing reward is never
    made up as 0.0."""
    res = _map(res, what)
    obs = res.get("obs")
    info = res.get("info")
    if not isinstance(obs, dict) or not isinstance(info, dict):
        raise BadResponseError("%s: result without obs and info maps: %r" % (what, sorted(res)))
    reward = res.get("reward")
    if reward is not None:
        if isinstance(reward, bool) or not isinstance(reward, (int, float)):
            raise BadResponseError("%s: reward is %r, want a number" % (what, reward))
        reward = float(reward)
    return obs, reward, bool(res.get("terminated")), bool(res.get("truncated")), info


class AsyncClient:
    """Asyncio client of an Arbor server. Requests are pipelined: any number
    may be in flight on the one websocket (up to the server's max_in_flight,
    beyond which they wait on the client), and are answered in any order.

        async with AsyncClient("ws://127.0.0.1:7878/v1/ws") as c:
            env = c.env(task="hello")
            obs, info = await env.reset()
            obs, reward, terminated, truncated, info = await env.step("ls")

    timeout (seconds; None: wait forever) is the default of every call's
    own timeout=. reconnect: when the connection drops, the next call
    opens a new one (backoff from 0.1 s doubling to 2 s, for up to
    reconnect_timeout seconds), and calls that were in flight are sent
    again when that is safe (idempotent calls: reads, close, rollback,
    checkpoint, and steps with a request key); the others fail with
    ConnectionClosedError(retryable=False). Envs belong to the server and
    outlive connections: AsyncEnv objects go on working, and attach(env_id)
    makes one for an env id from anywhere. origin, when set, is sent as
    the Origin header.

    max_in_flight caps the requests this client has outstanding on its
    connection (default and ceiling: the max_in_flight of the server's
    hello); more wait on the client. A too_many_requests answer was refused
    before anything ran (the server counts a request until just after its
    answer is sent, it refuses requests while its memory for unread answers
    is full, and its admission control refuses a request that would wait
    longer than its bound), so the call sends it again instead of raising:
    after the answer's retry_after (admission control's hint) plus up to
    half of it again at random, so that clients refused together do not
    come back together, else after a short backoff (50 ms doubling to 1 s);
    up to busy_retries times (default 20), within its timeout and at most
    busy_max_wait seconds of such waits (default 60); past them the
    ArborError (code too_many_requests, retry_after set) is raised.

    A URL that is not a v1 endpoint (not ws:// or wss://, or answered with
    an HTTP status such as 404 instead of a websocket upgrade) raises
    BadURLError at once (retryable=False, infra=False); a refused
    connection is a retryable ConnectionClosedError.
    """

    def __init__(self, url: str, token: Optional[str] = None, open_timeout: float = 10.0,
                 timeout: Optional[float] = None, reconnect: bool = True, reconnect_timeout: float = 30.0,
                 origin: Optional[str] = None, max_in_flight: Optional[int] = None,
                 busy_retries: int = 20, busy_max_wait: float = 60.0) -> None:
        if max_in_flight is not None and int(max_in_flight) < 1:
            raise ValueError("max_in_flight must be at least 1, not %r" % (max_in_flight,))
        self.url = url
        self.token = token
        self.open_timeout = open_timeout
        self.timeout = timeout
        self.reconnect = reconnect
        self.reconnect_timeout = reconnect_timeout
        self.origin = origin
        self.busy_retries = busy_retries
        self.busy_max_wait = busy_max_wait
        self._max_in_flight = None if max_in_flight is None else int(max_in_flight)
        self.max_in_flight: Optional[int] = self._max_in_flight  # in effect: min(asked, hello's)
        self.version: Optional[int] = None
        self.capabilities: Dict[str, Any] = {}
        self.server: Optional[str] = None
        self.reconnects = 0
        self._conn: Optional[Connection] = None
        self._connected = False
        self._closing = False
        self._lock: Optional[asyncio.Lock] = None
        self._listeners: List[Callable[[str, Any], None]] = []

    @property
    def step_keys(self) -> bool:
        """The server takes request keys on steps (hello's step_keys)."""
        return bool(self.capabilities.get("step_keys"))

    async def _open(self) -> Connection:
        conn = await Connection.open(self.url, self.token, self.open_timeout, self.origin)
        try:
            hello = _map(await conn.call("hello", {"token": self.token} if self.token else {},
                                         timeout=self.open_timeout), "hello")
        except BaseException:
            await conn.close()
            raise
        if hello.get("version") != PROTOCOL_VERSION:
            await conn.close()
            raise ArborError("bad_request", "server speaks protocol %r, this client %d" % (hello.get("version"), PROTOCOL_VERSION))
        self.version = hello.get("version")
        caps = hello.get("capabilities")
        self.capabilities = caps if isinstance(caps, dict) else {}
        self.server = hello.get("server")
        limits = [n for n in (self._max_in_flight, self.capabilities.get("max_in_flight"))
                  if isinstance(n, int) and not isinstance(n, bool) and n > 0]
        self.max_in_flight = min(limits) if limits else None
        conn.set_max_in_flight(self.max_in_flight)
        for fn in self._listeners:
            conn.add_listener(fn)
        return conn

    async def connect(self) -> "AsyncClient":
        """Opens the websocket and says hello; called by `async with`."""
        if self._conn is not None:
            return self
        self._closing = False
        self._conn = await self._open()
        self._connected = True
        return self

    async def _connection(self) -> Connection:
        if self._closing:
            raise ConnectionClosedError("the client is closed", retryable=False)
        c = self._conn
        if c is not None and c.closed is None:
            return c
        if not self._connected:
            raise ConnectionClosedError("not connected: use `async with` or connect()", retryable=False)
        if not self.reconnect:
            raise ConnectionClosedError(c.closed.message if c is not None and c.closed else "connection closed", retryable=False)
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            c = self._conn
            if c is not None and c.closed is None:
                return c
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.reconnect_timeout
            delay = 0.1
            while True:
                if self._closing:
                    raise ConnectionClosedError("the client is closed", retryable=False)
                try:
                    self._conn = await self._open()
                    self.reconnects += 1
                    log.info("arbor_env: reconnected to %s", self.url)
                    return self._conn
                except ConnectionClosedError as e:
                    if loop.time() + delay > deadline:
                        raise ConnectionClosedError("reconnect to %s for %ss failed: %s" % (self.url, self.reconnect_timeout, e.message)) from e
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def __aenter__(self) -> "AsyncClient":
        return await self.connect()

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        """Closes the connection (the server keeps the envs until their idle
        TTL or close). Calling it again does nothing."""
        self._closing = True
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await conn.close()

    async def call(self, method: str, params: Optional[dict] = None, on_notify: Optional[Callable[[dict], None]] = None,
                   timeout: Any = _DEFAULT, idempotent: Optional[bool] = None, request_key: Optional[str] = None) -> Any:
        """Raw protocol call: returns the result or raises ArborError.
        timeout: seconds (None: forever; default: the client's). idempotent
        (default: by method) says whether a call that lost its answer to a
        dropped connection may be sent again after the reconnect."""
        if timeout is _DEFAULT:
            timeout = self.timeout
        if idempotent is None:
            idempotent = method in IDEMPOTENT
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        attempts = busy = 0
        delay, waited = 0.05, 0.0
        while True:
            conn = await self._connection()
            left = None if deadline is None else max(0.0, deadline - loop.time())
            try:
                return await conn.call(method, params, on_notify, left, idempotent, request_key)
            except ConnectionClosedError as e:
                attempts += 1
                if self._closing or not self.reconnect or not e.retryable or attempts > 5:
                    raise
                if deadline is not None and loop.time() >= deadline:
                    raise
                log.info("arbor_env: %s: %s; sending it again on a new connection", method, e.message)
            except ArborError as e:
                # Refused before it ran (the connection's in-flight limit or
                # the server's answer memory): safe to send again.
                busy += 1
                if e.code != "too_many_requests" or busy > self.busy_retries or self._closing:
                    raise
                if e.retry_after is not None:
                    wait = e.retry_after * (1 + random.random() / 2)
                else:
                    wait, delay = delay, min(delay * 2, 1.0)
                if deadline is not None and loop.time() + wait >= deadline:
                    raise
                if waited + wait > self.busy_max_wait:
                    raise
                waited += wait
                await asyncio.sleep(wait)

    def on_notification(self, fn: Callable[[str, Any], None]) -> None:
        """fn(method, params) receives server notifications not tied to a
        request (also after a reconnect). An exception it raises is logged
        (logger "arbor_env"); it does not end the connection."""
        self._listeners.append(fn)
        if self._conn is not None:
            self._conn.add_listener(fn)

    async def hello(self) -> Dict[str, Any]:
        return _map(await self.call("hello", {"token": self.token} if self.token else {}), "hello")

    def env(self, task: Optional[str] = None, image: Optional[str] = None, seed: Optional[int] = None,
            options: Optional[dict] = None, dataset: Optional[str] = None,
            index: Optional[int] = None) -> "AsyncEnv":
        """An Env for a task, an image, or a dataset's instance (index,
        else the one seed picks); reset() starts it."""
        return AsyncEnv(self, task=task, image=image, seed=seed, options=options, dataset=dataset, index=index)

    async def tasks(self, dataset: Optional[str] = None, cursor: Optional[str] = None,
                    limit: Optional[int] = None, timeout: Any = _DEFAULT) -> Dict[str, Any]:
        """One page of the server's tasks (and its datasets), or of a
        dataset's instances: {"tasks": [...], "datasets": [...],
        "next_cursor": ""}; pass next_cursor back for the next page."""
        params: Dict[str, Any] = {}
        if dataset:
            params["dataset"] = dataset
        if cursor:
            params["cursor"] = cursor
        if limit:
            params["limit"] = int(limit)
        return _map(await self.call("tasks", params, timeout=timeout), "tasks")

    async def make(self, task: Optional[str] = None, image: Optional[str] = None, seed: Optional[int] = None,
                   options: Optional[dict] = None) -> Tuple["AsyncEnv", Dict[str, Any], Dict[str, Any]]:
        """env(...) and reset() in one: returns (env, obs, info)."""
        env = self.env(task=task, image=image, seed=seed, options=options)
        obs, info = await env.reset()
        return env, obs, info

    async def attach(self, env_id: str, timeout: Any = _DEFAULT) -> "AsyncEnv":
        """An AsyncEnv for an env the server has open (made by this or any
        other connection, e.g. before a reconnect or a restart of the
        trainer): its task, image, head state and turn come from `envs`."""
        for e in await self.envs(timeout=timeout):
            if e.get("env_id") != env_id:
                continue
            if e.get("lost"):
                raise ArborError("env_lost", "env %s: %s" % (env_id, e["lost"]), retryable=False, infra=True)
            env = AsyncEnv(self, env_id=env_id, task=e.get("task") or None, image=e.get("image") or None)
            env.state_id = e.get("head")
            env.turn = int(e.get("turn") or 0)
            env.origin = e.get("origin") or None
            return env
        raise ArborError("unknown_env", "no open env %r" % env_id)

    async def branch_state(self, state_id: str, n: int, allow_partial: bool = False,
                           timeout: Any = _DEFAULT) -> List[Optional["AsyncEnv"]]:
        """n new envs at a state id seen earlier (of any live lineage); they
        carry the task and turn the server reports for that state."""
        res = await self.call("branch", {"state_id": state_id, "n": int(n)}, timeout=timeout)
        return _children(self, res, AsyncEnv, None, allow_partial)

    async def prepare(self, state_ids: Sequence[str], n: int, wait: bool = False,
                      timeout: Any = _DEFAULT) -> Dict[str, Any]:
        """Asks the server to restore n frozen copies of each state ahead of
        branches from it (a prefetch hint: branch_state from a prepared
        state only thaws them). With wait, answers once they are ready.
        Returns {"prepared": {state: n}, "ready": {state: n}} and, when some
        did not fit in the server's budget, "refused"; when none fit, raises
        ArborError with code "over_budget" (retryable)."""
        res = _map(await self.call("prepare", {"state_ids": list(state_ids), "n": int(n), "wait": bool(wait)},
                                   timeout=timeout), "prepare")
        out = {"prepared": _field(res, "prepared", dict, "prepare"), "ready": _field(res, "ready", dict, "prepare")}
        refused = _field(res, "refused", dict, "prepare", required=False)
        if refused:
            out["refused"] = refused
        return out

    async def trajectory(self, state_id: str, timeout: Any = _DEFAULT) -> Dict[str, Any]:
        """The path from the root to a state (also one of an env closed
        since, while the server retains it), as the server recorded it:
        {"state_id", "root", "turns": [...]}, each turn with its "action"
        as sent, "obs", "state_id", "checkpoint", "reward" (the newest
        evaluate of its state, if any) and timings. An unknown state raises
        ArborError with code "unknown_state"."""
        return _map(await self.call("trajectory", {"state_id": state_id}, timeout=timeout), "trajectory")

    def _batch_wire(self, items: Sequence[Tuple[Any, Action]]) -> Tuple[List[dict], List[Optional["AsyncEnv"]]]:
        wire, envs = [], []
        for env, action in items:
            env_id = env.env_id if isinstance(env, AsyncEnv) else env
            envs.append(env if isinstance(env, AsyncEnv) else None)
            w = {"env_id": env_id, "action": make_action(action)}
            if self.step_keys:
                w["key"] = new_key()
            wire.append(w)
        return wire, envs

    async def step_batch(self, items: Sequence[Tuple[Any, Action]],
                         on_result: Optional[Callable[[int, Outcome], None]] = None,
                         timeout: Any = _DEFAULT) -> List[Outcome]:
        """Steps many envs in one request. items: [(env_or_id, action)].
        on_result(index, step_tuple_or_ArborError) is called as each item
        finishes (first finishers first); returns the list in request order,
        an ArborError in place of each item that failed. More items than the
        server's max_batch go as several requests at once. Every item has a
        request key, so a batch cut by a dropped connection is sent again
        without running any item twice."""
        wire, envs = self._batch_wire(items)
        out: List[Any] = [None] * len(wire)
        size = int(self.capabilities.get("max_batch") or 0) or max(1, len(wire))

        notified_once = set()

        async def chunk(off: int) -> None:
            part = wire[off:off + size]

            def notified(p: dict) -> None:
                # A chunk sent again after a reconnect is notified again
                # (its items replayed): on_result sees each item once.
                i = p.get("index")
                if on_result is not None and isinstance(i, int) and 0 <= i < len(part) and off + i not in notified_once:
                    notified_once.add(off + i)
                    on_result(off + i, _item_outcome(p))

            res = _map(await self.call("step_batch", {"items": part}, on_notify=notified, timeout=timeout,
                                       idempotent=self.step_keys), "step_batch")
            results = res.get("results")
            if not isinstance(results, list):
                raise BadResponseError("step_batch: results is %r, want an array" % (results,))
            for p in results:
                i = p.get("index") if isinstance(p, dict) else None
                if not isinstance(i, int) or not 0 <= i < len(part):
                    raise BadResponseError("step_batch: result with index %r of %d items" % (i, len(part)))
                out[off + i] = _item_outcome(p)

        await asyncio.gather(*[chunk(off) for off in range(0, len(wire), size)])
        for i, outcome in enumerate(out):
            if outcome is None:
                out[i] = BadResponseError("step_batch: no result for item %d" % i)
            elif envs[i] is not None and not isinstance(outcome, ArborError):
                envs[i]._note(outcome[4])
        return out

    async def envs(self, timeout: Any = _DEFAULT) -> List[Dict[str, Any]]:
        """The open envs: list of {env_id, image, task, origin, head, turn, idle_s, recovered?}, and envs lost in a crash as {env_id, image, task, head, lost}."""
        return _map(await self.call("envs", {}, timeout=timeout), "envs").get("envs") or []


def _item_outcome(p: Any) -> Outcome:
    if not isinstance(p, dict):
        return BadResponseError("step_batch item is %r, want a map" % (p,))
    if p.get("error") is not None:
        return error_from_wire(p["error"])
    try:
        return step_tuple(p.get("result"), "step_batch item")
    except ArborError as e:
        return e


E = TypeVar("E", bound="AsyncEnv")


def _children(client: AsyncClient, res: Any, cls: Type[E], parent: Optional["AsyncEnv"], allow_partial: bool) -> List[Optional[E]]:
    res = _map(res, "branch")
    ids = res.get("env_ids")
    if not isinstance(ids, list):
        raise BadResponseError("branch: env_ids is %r, want an array" % (ids,))
    errs = res.get("errors") or [None] * len(ids)
    task = res.get("task") or (parent.task if parent else None)
    turn = res.get("turn")
    if not isinstance(turn, int):
        turn = parent.turn if parent else 0
    envs: List[Optional[E]] = []
    errors: List[Optional[ArborError]] = []
    for i, env_id in enumerate(ids):
        err = errs[i] if i < len(errs) else None
        if env_id and err is None:
            child = cls(client, env_id=env_id, task=task, image=parent.image if parent else None)
            child.state_id = res.get("state_id")
            child.turn = turn
            child.parent = parent
            child.origin = parent.env_id if parent else None
            envs.append(child)
            errors.append(None)
        else:
            envs.append(None)
            errors.append(error_from_wire(err) if err is not None else ArborError("internal", "child %d missing" % i))
    if any(e is not None for e in errors) and not allow_partial:
        raise BranchError(envs, errors)
    return envs


class AsyncEnv:
    """One environment on the server. reset() (re)starts it; every other
    method needs a started env. Gymnasium-style: step returns
    (obs, reward, terminated, truncated, info); info["state_id"] names the
    state after each turn, usable with branch_state and rollback.
    Every method takes timeout= (seconds; None: forever; default: the
    client's).

    done is `terminated or truncated` of the last step (False after reset,
    rollback and in a new branch child). Episode ends, as Gymnasium and
    Arbor's OpenEnv endpoint have them: terminated on submit (step(SUBMIT): the verifier grades the
    state, nothing runs), truncated once the task's max_turns turns are
    reached. A step after either raises ArborError "bad_request" until
    reset() or a rollback (method or tool): after submit the client
    refuses it, after truncation the server (docs/protocol.md, "Episode
    end"), as the OpenEnv endpoint does."""

    def __init__(self, client: AsyncClient, env_id: Optional[str] = None, task: Optional[str] = None,
                 image: Optional[str] = None, seed: Optional[int] = None, options: Optional[dict] = None,
                 dataset: Optional[str] = None, index: Optional[int] = None) -> None:
        self.client = client
        self.env_id = env_id
        self.task = task
        self.image = image
        self.dataset = dataset
        self.index = index
        self.picked: Optional[str] = None  # a dataset reset's instance (DATASET/NAME)
        self.seed = seed
        self.options = options
        self.state_id: Optional[str] = None
        self.turn = 0
        self.closed = False
        self.done = False  # terminated or truncated of the last step
        self.submitted = False  # step(SUBMIT) ended the episode
        self.parent: Optional["AsyncEnv"] = None  # the env object this one was branched from
        self.origin: Optional[str] = None  # its id (promote's target)

    def __repr__(self) -> str:
        return "<AsyncEnv %s task=%s image=%s state=%s turn=%s>" % (self.env_id, self.task, self.image, self.state_id, self.turn)

    def _note(self, info: Dict[str, Any]) -> None:
        if info:
            self.state_id = info.get("state_id", self.state_id)
            self.turn = info.get("turn", self.turn)

    def _id(self) -> str:
        if self.env_id is None or self.closed:
            raise ArborError("bad_request", "env is not started (call reset) or was closed")
        return self.env_id

    async def reset(self, seed: Optional[int] = None, options: Optional[dict] = None,
                    timeout: Any = _DEFAULT) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        """Starts a new episode (closing the previous one of this object):
        returns (obs, info); obs["instruction"] holds the task's instruction."""
        if self.env_id is not None and not self.closed:
            await self.close(timeout=timeout)
        params: Dict[str, Any] = {}
        if self.task:
            params["task"] = self.task
        if self.image:
            params["image"] = self.image
        if self.dataset and not self.task:
            params["dataset"] = self.dataset
            if self.index is not None:
                params["index"] = int(self.index)
        seed = self.seed if seed is None else seed
        if seed is not None:
            params["seed"] = int(seed)
        options = self.options if options is None else options
        if options:
            params["options"] = options
        res = _map(await self.client.call("reset", params, timeout=timeout), "reset")
        env_id = _field(res, "env_id", str, "reset")
        info = res.get("info") if isinstance(res.get("info"), dict) else {}
        obs = res.get("obs") if isinstance(res.get("obs"), dict) else {}
        self.env_id, self.closed, self.parent, self.origin = env_id, False, None, None
        self.image = info.get("image") or self.image
        if self.dataset and not self.task:
            self.picked = info.get("task")  # the instance's task, DATASET/NAME
        self.turn = 0
        self.done = self.submitted = False
        self._note(info)
        return obs, info

    async def step(self, action: Action, timeout_s: Optional[float] = None, key: Optional[str] = None,
                   timeout: Any = _DEFAULT) -> StepTuple:
        """One turn: a bash command (str) or a tool dict. Returns
        (obs, reward, terminated, truncated, info).

        key: the step's request key (default: a fresh one when the server
        takes them). A step sent again with the key of one the server
        already ran answers that step's recorded result (info["replayed"])
        without running the command twice: retry with the request_key of a
        ClientTimeoutError. timeout_s bounds the command on the server,
        timeout the wait on the client.

        SUBMIT ({"tool": "submit"}) ends the episode: see submit(). After
        it, a step other than the rollback tool raises ArborError
        "bad_request" until reset or rollback; after truncation the server
        refuses it with "bad_request" (docs/protocol.md, "Episode end")."""
        if isinstance(action, dict) and action.get("tool") == "submit":
            return await self.submit(timeout=timeout)
        is_rollback = isinstance(action, dict) and action.get("tool") == "rollback"
        if self.submitted and not is_rollback:
            raise ArborError("bad_request", "env %s: the episode was submitted: reset() or rollback to go on" % self.env_id)
        if key is None and self.client.step_keys:
            key = new_key()
        params: Dict[str, Any] = {"env_id": self._id(), "action": make_action(action, timeout_s)}
        if key is not None:
            params["key"] = key
        res = await self.client.call("step", params, timeout=timeout,
                                     idempotent=key is not None and self.client.step_keys, request_key=key)
        t = step_tuple(res)
        self._note(t[4])
        if not (is_rollback and t[0].get("exit_code")):  # a failed rollback leaves the episode as it was
            self.submitted = False
        self.done = t[2] or t[3] or self.submitted
        return t

    async def submit(self, timeout: Any = _DEFAULT) -> StepTuple:
        """Ends the episode (what step(SUBMIT) does): nothing runs in the
        env; the task's verifier grades its current state (evaluate, the
        env stays open for rollback, branch and a later evaluate). Returns
        ({}, reward, True, False, info) with info "state_id", "turn",
        "submitted": True and "evaluation" (the verifier's details); reward
        is None for an env without a verifier (info["evaluation"]["error"]
        says so). A failure of the machinery raises ArborError (infra)."""
        eid = self._id()
        try:
            reward: Optional[float]
            reward, details = await self.evaluate(timeout=timeout)
        except ArborError as e:
            if e.infra or e.code != "bad_request":
                raise
            reward, details = None, {"error": str(e)}  # an image's env: no verifier
        self.done = self.submitted = True
        info = {"env_id": eid, "state_id": self.state_id, "turn": self.turn, "submitted": True, "evaluation": details}
        return {}, reward, True, False, info

    async def write_file(self, path: str, content: Union[str, bytes], timeout: Any = _DEFAULT) -> StepTuple:
        return await self.step({"tool": "write_file", "path": path, "content": content}, timeout=timeout)

    async def read_file(self, path: str, timeout: Any = _DEFAULT) -> StepTuple:
        return await self.step({"tool": "read_file", "path": path}, timeout=timeout)

    async def rollback_tool(self, state_id: str, timeout: Any = _DEFAULT) -> StepTuple:
        """Rollback as the agent's own action (a step): returns a step tuple."""
        return await self.step({"tool": "rollback", "state_id": state_id}, timeout=timeout)

    async def branch(self: E, n: int, allow_partial: bool = False, timeout: Any = _DEFAULT) -> List[Optional[E]]:
        """n independent copies of this env's current state, as new envs.
        If some fail, raises BranchError (its .envs holds the ones made)
        unless allow_partial, in which case failed children are None."""
        res = await self.client.call("branch", {"env_id": self._id(), "n": int(n)}, timeout=timeout)
        return _children(self.client, res, type(self), self, allow_partial)

    async def checkpoint(self, timeout: Any = _DEFAULT) -> str:
        """Forces a checkpoint; returns its state id."""
        res = _map(await self.client.call("checkpoint", {"env_id": self._id()}, timeout=timeout), "checkpoint")
        sid = _field(res, "state_id", str, "checkpoint")
        self.state_id = sid
        return sid

    async def rollback(self, state_id: str, timeout: Any = _DEFAULT) -> Dict[str, Any]:
        """Returns the env to a state it (or its lineage) had; returns info."""
        res = _map(await self.client.call("rollback", {"env_id": self._id(), "state_id": state_id}, timeout=timeout), "rollback")
        info = res.get("info") if isinstance(res.get("info"), dict) else {}
        self._note(info)
        self.done = self.submitted = False
        return info

    async def evaluate(self, fork: bool = True, timeout: Any = _DEFAULT) -> Tuple[float, Dict[str, Any]]:
        """Grades the env's current state in the server's trusted grader:
        (reward, details); the env goes on. With fork=False the episode is
        over: the server closes the env once graded (see finish). A failure
        of the machinery raises ArborError (infra=True), a verifier result
        the task's rules refuse ArborError("verifier_error"), and an answer
        without a reward BadResponseError; none is ever a zero reward."""
        params: Dict[str, Any] = {"env_id": self._id()}
        if not fork:
            params["fork"] = False
        try:
            res = _map(await self.client.call("evaluate", params, timeout=timeout), "evaluate")
        except ArborError as e:
            if not fork and not e.infra:
                self.closed = True  # the server closed it: the episode is over
            raise
        if not fork:
            self.closed = True
        reward = res.get("reward")
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise BadResponseError("evaluate: reward is %r, want a number" % (reward,))
        details = res.get("details")
        return float(reward), details if isinstance(details, dict) else {}

    async def finish(self, timeout: Any = _DEFAULT) -> Tuple[float, Dict[str, Any]]:
        """Grades a finished leaf and closes it in one request:
        evaluate(fork=False)."""
        return await self.evaluate(fork=False, timeout=timeout)

    async def promote(self, timeout: Any = _DEFAULT) -> Optional[str]:
        """Adopts this branch's state as its parent's (draft accepted); this
        env is closed. Returns the adopted state id; the parent's AsyncEnv
        (when this one came from its branch()) takes that state and turn."""
        res = _map(await self.client.call("promote", {"env_id": self._id()}, timeout=timeout), "promote")
        self.closed = True
        sid = res.get("state_id")
        p = self.parent
        if p is not None and p.env_id == res.get("env_id") and sid:
            p.state_id, p.turn = sid, self.turn
        return sid

    async def discard(self, timeout: Any = _DEFAULT) -> None:
        """Throws this branch away (draft rejected)."""
        await self.client.call("discard", {"env_id": self._id()}, timeout=timeout)
        self.closed = True

    async def states(self, timeout: Any = _DEFAULT) -> List[Dict[str, Any]]:
        """The lineage of this env's head, root first."""
        return _map(await self.client.call("states", {"env_id": self._id()}, timeout=timeout), "states").get("states") or []

    async def trajectory(self, timeout: Any = _DEFAULT) -> Dict[str, Any]:
        """The path from the root to this env's head, as the server recorded
        it (also after this client restarted): see AsyncClient.trajectory."""
        return _map(await self.client.call("trajectory", {"env_id": self._id()}, timeout=timeout), "trajectory")

    async def close(self, timeout: Any = _DEFAULT) -> None:
        """Closes the env on the server; again, or on an env already gone, it does nothing."""
        if self.env_id is None or self.closed:
            return
        try:
            await self.client.call("close", {"env_id": self.env_id}, timeout=timeout)
        except ArborError as e:
            if e.code != "unknown_env":
                raise
        self.closed = True

    async def __aenter__(self: E) -> E:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        # A failed close must not hide the body's own exception; a
        # cancellation (of the body or of this close) is never swallowed.
        try:
            await self.close()
        except ArborError as e:
            if exc[0] is None:
                raise
            log.warning("arbor_env: close of %s after %s: %s", self.env_id, exc[0].__name__, e)
