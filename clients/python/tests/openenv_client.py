"""A small OpenEnv client, written independently from OpenEnv's
``src/openenv/core/env_client.py`` and ``generic_client.py``
(meta-pytorch/OpenEnv) to speak to Arbor's OpenEnv endpoint exactly as
they do:

- ``base_url`` http(s):// becomes ws(s)://, trailing "/" dropped, and the
  websocket is ``{base_url}/ws`` (``convert_to_ws_url``), opened with
  ``open_timeout=connect_timeout_s`` and ``max_size`` of
  ``max_message_size_mb`` (100 MB); no headers of its own;
- every call is ``json.dumps({"type": ..., "data": ...})`` as one text
  message (``state`` sends no ``data``; ``reset`` sends its kwargs,
  ``step`` the action dict as is), then one message read within
  ``message_timeout_s`` and ``json.loads``-ed;
- an answer of type ``"error"`` raises ``RuntimeError("Server error:
  {message} (code: {code})")``;
- ``reset``/``step`` answers become ``StepResult(observation=data
  .get("observation", {}), reward=data.get("reward"), done=data.get("done",
  False))``; ``state`` returns ``data``;
- disconnect sends ``{"type": "close"}`` (best effort) and closes the
  socket without reading an answer.

It runs on websockets 10 (Debian 12) as well as >= 13 (which OpenEnv
needs): the connect call is the only difference.
"""

import asyncio
import json
from dataclasses import dataclass
from typing import Any, Dict, Optional

try:  # websockets >= 13, as OpenEnv imports it
    from websockets.asyncio.client import connect as _ws_connect
except ImportError:  # websockets 10-12
    from websockets import connect as _ws_connect


@dataclass
class StepResult:
    observation: Dict[str, Any]
    reward: Optional[float] = None
    done: bool = False


def convert_to_ws_url(url: str) -> str:
    ws = url.rstrip("/")
    if ws.startswith("http://"):
        return "ws://" + ws[7:]
    if ws.startswith("https://"):
        return "wss://" + ws[8:]
    if not ws.startswith(("ws://", "wss://")):
        return "ws://" + ws
    return ws


class GenericEnvClient:
    def __init__(self, base_url: str, connect_timeout_s: float = 10.0, message_timeout_s: float = 60.0,
                 max_message_size_mb: float = 100.0, ws_suffix: str = "") -> None:
        # ws_suffix: what Arbor's extension appends (?session=ID); a plain
        # OpenEnv client has none.
        self._ws_url = convert_to_ws_url(base_url) + "/ws" + ws_suffix
        self._connect_timeout = connect_timeout_s
        self._message_timeout = message_timeout_s
        self._max_message_size = int(max_message_size_mb * 1024 * 1024)
        self._ws = None

    async def connect(self) -> "GenericEnvClient":
        if self._ws is not None:
            return self
        try:
            self._ws = await _ws_connect(self._ws_url, open_timeout=self._connect_timeout, max_size=self._max_message_size)
        except Exception as e:
            raise ConnectionError("Failed to connect to %s: %s" % (self._ws_url, e)) from e
        return self

    async def disconnect(self) -> None:
        if self._ws is not None:
            try:
                await self._send({"type": "close"})
            except Exception:
                pass
            try:
                await self._ws.close()
            except Exception:
                pass
            self._ws = None

    async def _send(self, message: Dict[str, Any]) -> None:
        await self.connect()
        await self._ws.send(json.dumps(message))

    async def _receive(self) -> Dict[str, Any]:
        raw = await asyncio.wait_for(self._ws.recv(), timeout=self._message_timeout)
        return json.loads(raw)

    async def _send_and_receive(self, message: Dict[str, Any]) -> Dict[str, Any]:
        await self._send(message)
        response = await self._receive()
        if response.get("type") == "error":
            error_data = response.get("data", {})
            raise RuntimeError("Server error: %s (code: %s)" % (error_data.get("message", "Unknown error"),
                                                               error_data.get("code", "UNKNOWN")))
        return response

    @staticmethod
    def _parse_result(payload: Dict[str, Any]) -> StepResult:
        return StepResult(observation=payload.get("observation", {}), reward=payload.get("reward"),
                          done=payload.get("done", False))

    async def reset(self, **kwargs: Any) -> StepResult:
        response = await self._send_and_receive({"type": "reset", "data": kwargs})
        return self._parse_result(response.get("data", {}))

    async def step(self, action: Dict[str, Any]) -> StepResult:
        response = await self._send_and_receive({"type": "step", "data": action})
        return self._parse_result(response.get("data", {}))

    async def state(self) -> Dict[str, Any]:
        response = await self._send_and_receive({"type": "state"})
        return response.get("data", {})

    async def close(self) -> None:
        await self.disconnect()

    # Arbor's extensions, in the same message style.
    async def call(self, typ: str, data: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        m: Dict[str, Any] = {"type": typ}
        if data is not None:
            m["data"] = data
        return await self._send_and_receive(m)

    async def __aenter__(self) -> "GenericEnvClient":
        return await self.connect()

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
