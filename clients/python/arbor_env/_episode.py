"""Episode semantics on top of an env: a submit rule, max_turns, the
verifier's reward at the end, and a masked flag for infra failures."""

import inspect
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Dict, List, Optional, Union

from ._async import Action, AsyncEnv, StepTuple
from ._errors import ArborError

SUBMIT: Dict[str, Any] = {"tool": "submit"}

# Errors that are the agent's doing (a malformed tool call, an output or a
# command too big): recorded as that turn's observation, the episode goes on.
AGENT_ERRORS = frozenset(["invalid_params", "too_large", "bad_request"])


def is_submit(action: Action) -> bool:
    return isinstance(action, dict) and action.get("tool") == "submit"


@dataclass
class Turn:
    action: Any
    obs: Dict[str, Any]
    state_id: Optional[str]
    turn: int
    error: Optional[str] = None  # an agent error (AGENT_ERRORS) instead of a step


@dataclass
class Trajectory:
    """What an episode did. reward is the verifier's (evaluate) at the end,
    None while running and when masked. masked: an infra failure (of Arbor,
    the sandbox or the connection) hit the episode; a trainer must mask it,
    not score it. end: "submit", "max_turns", "terminated", "masked" or ""
    (still running)."""

    env_id: Optional[str]
    task: Optional[str]
    start_state_id: Optional[str] = None
    turns: List[Turn] = field(default_factory=list)
    reward: Optional[float] = None
    details: Dict[str, Any] = field(default_factory=dict)
    masked: bool = False
    mask_reason: Optional[str] = None
    end: str = ""

    @property
    def done(self) -> bool:
        return self.end != ""

    @property
    def state_ids(self) -> List[Optional[str]]:
        """The state after each turn, the start first."""
        return [self.start_state_id] + [t.state_id for t in self.turns]


class AsyncEpisode:
    """One episode of an AsyncEnv:

        ep = AsyncEpisode(env, max_turns=8)
        obs, info = await ep.reset()
        while not ep.done:
            obs, reward, terminated, truncated, info = await ep.step(policy(obs))
        ep.trajectory.reward, ep.trajectory.masked

    The episode ends on the action {"tool": "submit"} (SUBMIT; nothing runs
    in the env), on max_turns turns (default: the task's max_turns from
    reset's info; None and no task limit: never), or when the server says
    terminated; it then runs evaluate() and the returned reward is the
    verifier's (None for an env without a verifier: details["error"]). An
    ArborError with infra=True (from step or evaluate) ends
    the episode masked, with reward None, instead of raising; an error that
    is the agent's doing (invalid_params, too_large, bad_request) becomes
    that turn's observation ({"error": ...}). Other errors are raised.

    done is True exactly when the step that ended the episode returned
    terminated or truncated (truncated also for a masked end); a step
    after that raises ArborError("bad_request"). AsyncEnv.step(SUBMIT)
    outside an episode does the same grading (AsyncEnv.submit).
    """

    def __init__(self, env: AsyncEnv, max_turns: Optional[int] = None, evaluate: bool = True) -> None:
        self.env = env
        self.max_turns = max_turns
        self.evaluate = evaluate
        self.trajectory = Trajectory(env.env_id, env.task)

    @property
    def done(self) -> bool:
        return self.trajectory.done

    def _mask(self, e: ArborError) -> None:
        t = self.trajectory
        t.masked, t.mask_reason, t.end, t.reward = True, "%s: %s" % (e.code, e.message), "masked", None

    async def reset(self, seed: Optional[int] = None) -> Any:
        obs, info = await self.env.reset(seed=seed)
        self.trajectory = Trajectory(self.env.env_id, self.env.task, start_state_id=info.get("state_id"))
        if self.max_turns is None and info.get("max_turns"):
            self.max_turns = int(info["max_turns"])
        return obs, info

    def start(self) -> None:
        """Begins the episode at the env's current state (a branch child,
        an attached env) instead of a reset."""
        self.trajectory = Trajectory(self.env.env_id, self.env.task, start_state_id=self.env.state_id)

    async def _finish(self, end: str) -> None:
        t = self.trajectory
        t.end = end
        if not self.evaluate:
            return
        try:
            t.reward, t.details = await self.env.evaluate()
        except ArborError as e:
            if e.infra:
                self._mask(e)
            elif e.code == "bad_request":  # an env without a verifier (an image's): no reward to give
                t.reward, t.details = None, {"error": str(e)}
            else:
                raise

    async def step(self, action: Action) -> StepTuple:
        """One turn (see the class). Returns (obs, reward, terminated,
        truncated, info): reward is the verifier's on the last turn, 0.0
        before; info["masked"] on a masked end."""
        t = self.trajectory
        if t.done:
            raise ArborError("bad_request", "the episode is over (%s)" % t.end)
        if t.env_id is None:
            t.env_id, t.task, t.start_state_id = self.env.env_id, self.env.task, self.env.state_id
        if is_submit(action):
            await self._finish("submit")
            # done: terminated, or truncated when an infra failure masked it.
            return {}, t.reward, not t.masked, t.masked, {"masked": t.masked, "end": t.end}
        try:
            obs, _, terminated, truncated, info = await self.env.step(action)
        except ArborError as e:
            if e.infra:
                self._mask(e)
                return {}, None, False, True, {"masked": True, "end": t.end, "error": e}
            if e.code not in AGENT_ERRORS:
                raise
            t.turns.append(Turn(action, {"error": str(e)}, self.env.state_id, self.env.turn, error=str(e)))
            obs, terminated, truncated, info = {"error": str(e)}, False, False, {}
        else:
            t.turns.append(Turn(action, obs, info.get("state_id"), int(info.get("turn") or 0)))
        if terminated:
            await self._finish("terminated")
        elif truncated or (self.max_turns is not None and len(t.turns) >= self.max_turns):
            await self._finish("max_turns")
            truncated = True
        if t.done:
            info = dict(info, masked=t.masked, end=t.end)
            return obs, t.reward, terminated and not t.masked, truncated or t.masked, info
        return obs, 0.0, False, False, info


Policy = Callable[[Dict[str, Any], Dict[str, Any]], Union[Action, Awaitable[Action]]]


async def run_episode(env: AsyncEnv, policy: Policy, max_turns: Optional[int] = None, reset: bool = True,
                      seed: Optional[int] = None) -> Trajectory:
    """Runs policy(obs, info) -> action (or an awaitable of one) on env
    until the episode ends (see AsyncEpisode); returns the trajectory.
    reset=False starts at the env's current state."""
    ep = AsyncEpisode(env, max_turns=max_turns)
    if reset:
        try:
            obs, info = await ep.reset(seed=seed)
        except ArborError as e:
            if not e.infra:
                raise
            ep._mask(e)
            return ep.trajectory
    else:
        ep.start()
        obs, info = {}, {"state_id": env.state_id, "turn": env.turn}
    while not ep.done:
        a = policy(obs, info)
        if inspect.isawaitable(a):
            a = await a
        obs, _, _, _, info = await ep.step(a)
    return ep.trajectory
