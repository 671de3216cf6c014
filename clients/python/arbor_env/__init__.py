"""Python client of Arbor, an environment server for RL agents.

Distribution `arbor-env`, import name `arbor_env` (the name `arbor` on the
Python package index is another project's).

Client (blocking) and AsyncClient (asyncio) speak protocol v1: msgpack-rpc
over one websocket, requests pipelined and answered out of order. Env and
AsyncEnv follow Gymnasium: reset() -> (obs, info) and
step(action) -> (obs, reward, terminated, truncated, info), plus what a
branching environment adds: branch(n), checkpoint(), rollback(state_id),
evaluate(), promote(), discard(). step(SUBMIT) ends the episode with
the verifier's reward (terminated); env.done is terminated or truncated
of the last step. Errors are ArborError(code, message,
retryable) with .infra set for failures of Arbor itself.

ArborSandboxBackend (arbor_env.sandbox) is an OpenEnv sandbox backend,
duck-typed to OpenEnv's protocol (it does not import OpenEnv), with fork
and rollback.

Depends only on msgpack and websockets (Debian 12's python3-msgpack 1.0 and
python3-websockets 10.4 work, as do newer ones).
"""

from ._async import AsyncClient, AsyncEnv, make_action, new_key, step_tuple
from ._episode import SUBMIT, AsyncEpisode, Trajectory, Turn, run_episode
from ._errors import (ArborError, BadResponseError, BadURLError, BranchError, ClientTimeoutError,
                      ConnectionClosedError)
from ._pool import AsyncEnvPool, PoolResult, step_batch_stream
from ._runner import AgentResult, ChatClient, ChatError, run_agent, tool_schemas
from ._sync import Client, Env, EnvPool, Episode
from .sandbox import ArborBgJob, ArborSandbox, ArborSandboxBackend, ExecResult

__all__ = ["Client", "AsyncClient", "Env", "AsyncEnv", "ArborError", "BadResponseError", "BadURLError", "BranchError",
           "ClientTimeoutError", "ConnectionClosedError", "make_action", "new_key", "step_tuple",
           "AsyncEnvPool", "EnvPool", "PoolResult", "step_batch_stream",
           "AsyncEpisode", "Episode", "Trajectory", "Turn", "SUBMIT", "run_episode",
           "AgentResult", "ChatClient", "ChatError", "run_agent", "tool_schemas",
           "ArborSandboxBackend", "ArborSandbox", "ArborBgJob", "ExecResult"]
__version__ = "0.2.0"
