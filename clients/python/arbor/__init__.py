"""Python client of Arbor, an environment server for RL agents.

Client (blocking) and AsyncClient (asyncio) speak protocol v1: msgpack-rpc
over one websocket, requests pipelined and answered out of order. Env and
AsyncEnv follow Gymnasium: reset() -> (obs, info) and
step(action) -> (obs, reward, terminated, truncated, info), plus what a
branching environment adds: branch(n), checkpoint(), rollback(state_id),
evaluate(), promote(), discard(). Errors are ArborError(code, message,
retryable) with .infra set for failures of Arbor itself.

Depends only on msgpack and websockets (Debian 12's python3-msgpack 1.0 and
python3-websockets 10.4 work, as do newer ones).
"""

from ._async import AsyncClient, AsyncEnv, make_action
from ._errors import ArborError, BranchError, ConnectionClosedError
from ._sync import Client, Env

__all__ = ["Client", "AsyncClient", "Env", "AsyncEnv", "ArborError", "BranchError", "ConnectionClosedError", "make_action"]
__version__ = "0.1.0"
