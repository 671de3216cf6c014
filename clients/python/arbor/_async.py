import asyncio

from ._errors import ArborError, BranchError, ConnectionClosedError
from ._rpc import Connection, error_from_wire

PROTOCOL_VERSION = 1


def make_action(action, timeout_s=None):
    """A step action: a str is a bash command; a dict is passed as is
    ({"tool": "write_file", "path": ..., "content": ...} and so on)."""
    if isinstance(action, str):
        a = {"tool": "bash", "cmd": action}
    elif isinstance(action, dict):
        a = dict(action)
    else:
        raise TypeError("action must be a str (bash command) or a dict, not %s" % type(action).__name__)
    if timeout_s is not None:
        a["timeout_s"] = float(timeout_s)
    if isinstance(a.get("content"), str):
        a["content"] = a["content"].encode()
    return a


def step_tuple(res):
    """(obs, reward, terminated, truncated, info), as Gymnasium's step returns."""
    return (res.get("obs") or {}, float(res.get("reward") or 0.0), bool(res.get("terminated")),
            bool(res.get("truncated")), res.get("info") or {})


class AsyncClient:
    """Asyncio client of an Arbor server. Requests are pipelined: any number
    may be in flight on the one websocket, and are answered in any order.

        async with AsyncClient("ws://127.0.0.1:7878/v1/ws") as c:
            env = c.env(task="hello")
            obs, info = await env.reset()
            obs, reward, terminated, truncated, info = await env.step("ls")
    """

    def __init__(self, url, token=None, open_timeout=10.0):
        self.url = url
        self.token = token
        self.open_timeout = open_timeout
        self.version = None
        self.capabilities = {}
        self.server = None
        self._conn = None

    async def connect(self):
        """Opens the websocket and says hello; called by `async with`."""
        if self._conn is not None:
            return self
        conn = await Connection.open(self.url, self.token, self.open_timeout)
        try:
            hello = await conn.call("hello", {"token": self.token} if self.token else {})
        except BaseException:
            await conn.close()
            raise
        if hello.get("version") != PROTOCOL_VERSION:
            await conn.close()
            raise ArborError("bad_request", "server speaks protocol %r, this client %d" % (hello.get("version"), PROTOCOL_VERSION))
        self.version = hello.get("version")
        self.capabilities = hello.get("capabilities") or {}
        self.server = hello.get("server")
        self._conn = conn
        return self

    async def __aenter__(self):
        return await self.connect()

    async def __aexit__(self, *exc):
        await self.close()

    async def close(self):
        """Closes the connection (the server keeps the envs until their idle TTL or close)."""
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await conn.close()

    async def call(self, method, params=None, on_notify=None):
        """Raw protocol call: returns the result or raises ArborError."""
        if self._conn is None:
            raise ConnectionClosedError("not connected: use `async with` or connect()")
        return await self._conn.call(method, params, on_notify)

    def on_notification(self, fn):
        """fn(method, params) receives server notifications not tied to a request."""
        if self._conn is None:
            raise ConnectionClosedError("not connected")
        self._conn.add_listener(fn)

    async def hello(self):
        return await self.call("hello", {"token": self.token} if self.token else {})

    def env(self, task=None, image=None, seed=None, options=None):
        """An Env for a task or an image; reset() starts it."""
        return AsyncEnv(self, task=task, image=image, seed=seed, options=options)

    async def make(self, task=None, image=None, seed=None, options=None):
        """env(...) and reset() in one: returns (env, obs, info)."""
        env = self.env(task=task, image=image, seed=seed, options=options)
        obs, info = await env.reset()
        return env, obs, info

    async def branch_state(self, state_id, n, allow_partial=False):
        """n new envs at a state id seen earlier (of any live lineage)."""
        res = await self.call("branch", {"state_id": state_id, "n": int(n)})
        return _children(self, res, AsyncEnv, None, allow_partial)

    async def step_batch(self, items, on_result=None):
        """Steps many envs in one request. items: [(env_or_id, action)].
        on_result(index, step_tuple_or_ArborError) is called as each item
        finishes (first finishers first); returns the list in request order,
        an ArborError in place of each item that failed."""
        wire = []
        envs = []
        for env, action in items:
            env_id = env.env_id if isinstance(env, AsyncEnv) else env
            envs.append(env if isinstance(env, AsyncEnv) else None)
            wire.append({"env_id": env_id, "action": make_action(action)})

        def notified(p):
            if on_result is not None:
                on_result(p.get("index"), _item_outcome(p))

        res = await self.call("step_batch", {"items": wire}, on_notify=notified)
        out = [None] * len(wire)
        for p in res.get("results") or []:
            i = p.get("index")
            outcome = _item_outcome(p)
            out[i] = outcome
            if envs[i] is not None and not isinstance(outcome, ArborError):
                envs[i]._note(outcome[4])
        return out

    async def envs(self):
        """The open envs: list of {env_id, image, task, origin, head, turn, idle_s, recovered?}, and envs lost in a crash as {env_id, image, task, head, lost}."""
        return (await self.call("envs", {})).get("envs") or []


def _item_outcome(p):
    if p.get("error") is not None:
        return error_from_wire(p["error"])
    return step_tuple(p.get("result") or {})


def _children(client, res, cls, parent, allow_partial):
    ids = res.get("env_ids") or []
    errs = res.get("errors") or [None] * len(ids)
    envs, errors = [], []
    for i, env_id in enumerate(ids):
        err = errs[i] if i < len(errs) else None
        if env_id and err is None:
            child = cls(client, env_id=env_id,
                        task=parent.task if parent else None, image=parent.image if parent else None)
            child.state_id = res.get("state_id")
            if parent is not None:
                child.turn = parent.turn
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
    state after each turn, usable with branch_state and rollback."""

    def __init__(self, client, env_id=None, task=None, image=None, seed=None, options=None):
        self.client = client
        self.env_id = env_id
        self.task = task
        self.image = image
        self.seed = seed
        self.options = options
        self.state_id = None
        self.turn = 0
        self.closed = False

    def __repr__(self):
        return "<AsyncEnv %s task=%s image=%s state=%s>" % (self.env_id, self.task, self.image, self.state_id)

    def _note(self, info):
        if info:
            self.state_id = info.get("state_id", self.state_id)
            self.turn = info.get("turn", self.turn)

    def _id(self):
        if self.env_id is None or self.closed:
            raise ArborError("bad_request", "env is not started (call reset) or was closed")
        return self.env_id

    async def reset(self, seed=None, options=None):
        """Starts a new episode (closing the previous one of this object):
        returns (obs, info); obs["instruction"] holds the task's instruction."""
        if self.env_id is not None and not self.closed:
            await self.close()
        params = {}
        if self.task:
            params["task"] = self.task
        if self.image:
            params["image"] = self.image
        seed = self.seed if seed is None else seed
        if seed is not None:
            params["seed"] = int(seed)
        options = self.options if options is None else options
        if options:
            params["options"] = options
        res = await self.client.call("reset", params)
        self.env_id, self.closed = res["env_id"], False
        info = res.get("info") or {}
        self.image = info.get("image") or self.image
        self._note(info)
        return res.get("obs") or {}, info

    async def step(self, action, timeout_s=None):
        """One turn: a bash command (str) or a tool dict. Returns
        (obs, reward, terminated, truncated, info)."""
        res = await self.client.call("step", {"env_id": self._id(), "action": make_action(action, timeout_s)})
        t = step_tuple(res)
        self._note(t[4])
        return t

    async def write_file(self, path, content):
        return await self.step({"tool": "write_file", "path": path, "content": content})

    async def read_file(self, path):
        return await self.step({"tool": "read_file", "path": path})

    async def rollback_tool(self, state_id):
        """Rollback as the agent's own action (a step): returns a step tuple."""
        return await self.step({"tool": "rollback", "state_id": state_id})

    async def branch(self, n, allow_partial=False):
        """n independent copies of this env's current state, as new envs.
        If some fail, raises BranchError (its .envs holds the ones made)
        unless allow_partial, in which case failed children are None."""
        res = await self.client.call("branch", {"env_id": self._id(), "n": int(n)})
        return _children(self.client, res, type(self), self, allow_partial)

    async def checkpoint(self):
        """Forces a checkpoint; returns its state id."""
        sid = (await self.client.call("checkpoint", {"env_id": self._id()}))["state_id"]
        self.state_id = sid
        return sid

    async def rollback(self, state_id):
        """Returns the env to a state it (or its lineage) had; returns info."""
        info = (await self.client.call("rollback", {"env_id": self._id(), "state_id": state_id})).get("info") or {}
        self._note(info)
        return info

    async def evaluate(self):
        """Runs the task's verifier on a throwaway fork: (reward, details).
        A failure of the machinery raises ArborError (infra=True); it is
        never a zero reward."""
        res = await self.client.call("evaluate", {"env_id": self._id()})
        return float(res.get("reward") or 0.0), res.get("details") or {}

    async def promote(self):
        """Adopts this branch's state as its parent's (draft accepted); this
        env is closed. Returns the adopted state id."""
        res = await self.client.call("promote", {"env_id": self._id()})
        self.closed = True
        return res.get("state_id")

    async def discard(self):
        """Throws this branch away (draft rejected)."""
        await self.client.call("discard", {"env_id": self._id()})
        self.closed = True

    async def states(self):
        """The lineage of this env's head, root first."""
        return (await self.client.call("states", {"env_id": self._id()})).get("states") or []

    async def close(self):
        if self.env_id is None or self.closed:
            return
        self.closed = True
        try:
            await self.client.call("close", {"env_id": self.env_id})
        except ArborError as e:
            if e.code != "unknown_env":
                raise

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        try:
            await self.close()
        except (ArborError, asyncio.CancelledError):
            pass
