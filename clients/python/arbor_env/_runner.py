"""An episode runner for OpenAI-style tool calling.

Given any OpenAI-compatible chat endpoint (base URL, model, key), it runs a
model as an agent on an Arbor env: the tools are the agent tools of
docs/agent-tools.md (bash, read_file, write_file, list_states, rollback,
fork_try) plus submit, offered as far as the server's hello lists them,
and every result is rendered as text the way the MCP tools render it. It
returns the messages, the verifier's reward, the masked flag and the state
id after each turn; fork_at={turn: k} forks the episode k ways at chosen
turns (Tree-GRPO groups), each child sampling its own continuation.
Standard library only (urllib) for the HTTP calls.
"""

import asyncio
import copy
import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from ._async import AsyncEnv
from ._episode import AsyncEpisode
from ._errors import ArborError

# The descriptions the model reads: agent/text.go's, for the same tools.
DESCRIPTIONS = {
    "bash": "Run a shell command in your sandbox's persistent shell and return its stdout, stderr and exit code.\n"
            "The shell keeps its state between calls: the current directory, exported and shell variables, functions and background jobs carry over.\n"
            "Every call that can change something is saved as a state you can return to later with rollback; the result names that state (state_id, turn).\n"
            "Use it for everything you would type at a terminal: building, testing, editing with sed, installing, running programs.\n"
            "A command that runs longer than timeout_s (default 60) is killed; the shell itself survives.",
    "read_file": "Read a file and return its content as text. It changes nothing and makes no new state.\n"
                 "Relative paths start at the shell's current directory. Large files come back with the middle cut out (truncated is set).",
    "write_file": "Create or overwrite a file with exactly the given content (missing parent directories are created).\n"
                  "Relative paths start at the shell's current directory. Like bash, the call is saved as a state you can roll back to.\n"
                  "Prefer it to echo/heredocs for writing source files: nothing gets mangled by shell quoting.",
    "list_states": "List your recent states in the order they were made: for each, its state_id, the turn, the tool call and command that produced it, its exit code, and whether it can still be restored.\n"
                   "\"current\" marks the state the sandbox is in now.\n"
                   "Call it when something went wrong and you want to find the last good point to return to.",
    "rollback": "Return the whole sandbox to an earlier state: files, running processes and the shell's state (directory, variables) become exactly what they were right after the call that produced that state.\n"
                "Use it when you broke something and undoing it by hand would be slow or uncertain: a build that no longer compiles, deleted or overwritten files, a botched refactor, a corrupted database, a process you killed.\n"
                "Take state_id from list_states (or from an earlier bash/write_file result). Only states of your own history can be restored.\n"
                "Nothing is lost: the states after it stay restorable and you can roll forward to them again.",
    "fork_try": "Try a command on a throwaway copy of your sandbox and report what it did: stdout, stderr and exit code.\n"
                "It has no side effects: your sandbox (files, processes, shell state) stays exactly as it is, whatever the command does, and no state is made.\n"
                "Use it to preview risky or destructive commands (rm, migrations, \"make clean\", a script you do not trust) or to check whether a fix builds before applying it.\n"
                "To keep the effect, run the command again with bash.",
    "submit": "Say that you are done with the task. Your work is then checked; nothing runs in the sandbox. Call it once, when the task is complete.",
}

_PARAMS = {
    "bash": {"type": "object", "properties": {
        "cmd": {"type": "string", "description": "the command line"},
        "timeout_s": {"type": "number", "description": "seconds before the command is killed (default 60)"}},
        "required": ["cmd"], "additionalProperties": False},
    "read_file": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"], "additionalProperties": False},
    "write_file": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                   "required": ["path", "content"], "additionalProperties": False},
    "list_states": {"type": "object", "properties": {"limit": {"type": "integer", "description": "most states to list (default 20)"}},
                    "additionalProperties": False},
    "rollback": {"type": "object", "properties": {"state_id": {"type": "string"}}, "required": ["state_id"], "additionalProperties": False},
    "fork_try": {"type": "object", "properties": {
        "cmd": {"type": "string"}, "timeout_s": {"type": "number"}}, "required": ["cmd"], "additionalProperties": False},
    "submit": {"type": "object", "properties": {}, "additionalProperties": False},
}

TOOLS = ["bash", "read_file", "write_file", "list_states", "rollback", "fork_try", "submit"]
# Tools that need a protocol step tool of the same name; list_states
# (states), fork_try (branch + bash) and submit (evaluate) need bash or nothing.
_NEEDS = {"bash": "bash", "read_file": "read_file", "write_file": "write_file", "rollback": "rollback", "fork_try": "bash"}

SYSTEM_PROMPT = ("You are an agent working in a Linux sandbox through tools. Every change is saved as a state: "
                 "when something breaks, list_states and rollback bring the sandbox back; fork_try previews a command "
                 "without side effects. Call submit when the task is done.")


def tool_schemas(server_tools: Optional[List[str]] = None, names: Optional[List[str]] = None) -> List[Dict[str, Any]]:
    """OpenAI tool schemas (type function) for the agent tools the server
    supports: server_tools is hello's capabilities["tools"] (the protocol's
    step tools); names limits the set."""
    out = []
    for n in names or TOOLS:
        need = _NEEDS.get(n)
        if server_tools is not None and need is not None and need not in server_tools:
            continue
        out.append({"type": "function", "function": {"name": n, "description": DESCRIPTIONS[n], "parameters": _PARAMS[n]}})
    return out


def _text(v: Any) -> str:
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return v or ""


def _first_line(s: str) -> str:
    more = False
    if "\n" in s:
        s, more = s.split("\n", 1)[0], True
    if len(s) > 200:
        s, more = s[:200], True
    return s + (" …" if more else "")


def _streams(stdout: str, stderr: str) -> str:
    out = ""
    if stdout:
        out += stdout if stdout.endswith("\n") else stdout + "\n"
    if stderr:
        out += "[stderr]\n" + (stderr if stderr.endswith("\n") else stderr + "\n")
    return out


def render_bash(cmd: str, obs: Dict[str, Any], info: Dict[str, Any], state: bool = True) -> str:
    """A bash result as the MCP tools word it (agent/text.go); state=False
    leaves out the state (fork_try's copy makes none)."""
    s = "$ %s\n" % _first_line(cmd) + _streams(_text(obs.get("stdout")), _text(obs.get("stderr")))
    s += "[exit code %s" % obs.get("exit_code")
    if obs.get("timed_out"):
        s += ", timed out"
    if obs.get("truncated"):
        s += ", output truncated"
    s += " · %.2f s · cwd %s" % (obs.get("duration_s") or 0.0, obs.get("cwd"))
    s += " · state %s (turn %s)]" % (info.get("state_id"), info.get("turn")) if state else "]"
    if info.get("shell_restarted"):
        s += "\n[the command ended the shell; a fresh shell took its place (variables and functions are gone)]"
    for lim in info.get("limits") or []:
        s += "\n[warning: " + lim + "]"
    return s


def render_read(obs: Dict[str, Any], info: Dict[str, Any]) -> str:
    if obs.get("exit_code"):
        return "error: " + (_text(obs.get("stderr")).strip() or "cannot read the file")
    s = _text(obs.get("stdout"))
    if obs.get("truncated"):
        s += "\n[truncated: the file has %s bytes; its head and tail are shown]" % info.get("stdout_bytes")
    return s


def render_write(path: str, content: str, obs: Dict[str, Any], info: Dict[str, Any]) -> str:
    if obs.get("exit_code"):
        return "error: " + (_text(obs.get("stderr")).strip() or "cannot write the file")
    return "wrote %d bytes to %s · state %s (turn %s)" % (len(content.encode()), path, info.get("state_id"), info.get("turn"))


def render_infra(e: ArborError) -> str:
    if e.infra:
        return "arbor infrastructure error, not caused by your command%s: %s: %s" % (
            " (retrying may help)" if e.retryable else "", e.code, e.message)
    return "error: %s: %s%s" % (e.code, e.message, " (retrying later may help)" if e.retryable else "")


class ChatError(Exception):
    """The chat endpoint failed (HTTP error, bad JSON): the episode is masked."""


class ChatClient:
    """A minimal client of an OpenAI-compatible /chat/completions endpoint."""

    def __init__(self, base_url: str, model: str, api_key: Optional[str] = None, timeout: float = 300.0,
                 extra: Optional[Dict[str, Any]] = None) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.api_key = api_key
        self.timeout = timeout
        self.extra = extra or {}

    def complete(self, messages: List[Dict[str, Any]], tools: List[Dict[str, Any]]) -> Dict[str, Any]:
        body = dict(self.extra, model=self.model, messages=messages, tools=tools, tool_choice="auto")
        req = urllib.request.Request(self.url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        if self.api_key:
            req.add_header("Authorization", "Bearer " + self.api_key)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                res = json.loads(r.read().decode())
        except urllib.error.HTTPError as e:
            raise ChatError("chat endpoint: HTTP %d: %s" % (e.code, e.read()[:300].decode("utf-8", "replace"))) from e
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise ChatError("chat endpoint: %s" % e) from e
        try:
            return res["choices"][0]["message"]
        except (KeyError, IndexError, TypeError) as e:
            raise ChatError("chat endpoint: no choices[0].message in %r" % (str(res)[:300],)) from e


@dataclass
class AgentTurn:
    tool: str
    args: Dict[str, Any]
    result: str
    state_id: Optional[str]
    turn: int


@dataclass
class AgentResult:
    """One trajectory of run_agent: messages (the chat, tool results
    included), reward (the verifier's; None when masked), masked and why,
    end ("submit", "max_turns", "stop": the model answered without a tool
    call, "masked"), the env's state id after each turn (the start first),
    the tool calls made, and the LLM / env time."""

    env_id: Optional[str]
    messages: List[Dict[str, Any]]
    reward: Optional[float] = None
    masked: bool = False
    mask_reason: Optional[str] = None
    end: str = ""
    state_ids: List[Optional[str]] = field(default_factory=list)
    calls: List[AgentTurn] = field(default_factory=list)
    fork_path: List[int] = field(default_factory=list)  # child index at each fork
    llm_s: float = 0.0
    env_s: float = 0.0


class _Run:
    def __init__(self, env: AsyncEnv, chat: ChatClient, tools: List[Dict[str, Any]], max_turns: Optional[int]) -> None:
        self.env = env
        self.chat = chat
        self.tools = tools
        self.names = {t["function"]["name"] for t in tools}
        self.ep = AsyncEpisode(env, max_turns=max_turns)
        self.log: Dict[str, str] = {}  # state id -> the call that made it

    async def call_tool(self, name: str, args: Dict[str, Any], res: AgentResult) -> str:
        env, ep = self.env, self.ep
        if name not in self.names:
            return "error: unknown tool %r (the tools are %s)" % (name, ", ".join(sorted(self.names)))
        try:
            if name == "submit":
                await ep.step({"tool": "submit"})
                return "submitted" + ("" if ep.trajectory.masked else "; reward %s" % ep.trajectory.reward)
            if name == "list_states":
                states = await env.states()
                limit = int(args.get("limit") or 20)
                lines = ["env %s, now at turn %s, state %s" % (env.env_id, env.turn, env.state_id)]
                if len(states) > limit:
                    lines.append("(%d older states not shown; pass a larger limit)" % (len(states) - limit))
                lines.append("turn  state_id        restorable  command")
                for st in states[-limit:]:
                    mark = "  <- current" if st.get("state_id") == env.state_id else ""
                    lines.append("%4s  %-14s  %-10s  %s%s" % (st.get("turn"), st.get("state_id"), "yes",
                                                             self.log.get(st.get("state_id"), "-"), mark))
                return "\n".join(lines)
            if name == "fork_try":
                kids = await env.branch(1)
                kid = kids[0]
                try:
                    obs, _, _, _, info = await kid.step(_bash(args))
                finally:
                    await kid.close()
                return ("(on a throwaway copy of state %s; your sandbox is unchanged)\n" % env.state_id +
                        render_bash(str(args.get("cmd", "")), obs, info, state=False) +
                        "\nfiles changed: unknown (not reported over protocol v1)")
            if name == "bash":
                action: Any = _bash(args)
            elif name == "read_file":
                action = {"tool": "read_file", "path": str(args.get("path", ""))}
            elif name == "write_file":
                action = {"tool": "write_file", "path": str(args.get("path", "")), "content": str(args.get("content", ""))}
            else:  # rollback
                action = {"tool": "rollback", "state_id": str(args.get("state_id", ""))}
            obs, _, _, _, info = await ep.step(action)
        except ArborError as e:
            if e.infra:
                ep._mask(e)
            return render_infra(e)
        if "error" in obs:
            return "error: " + obs["error"]
        if info.get("masked"):
            return render_infra(info["error"]) if isinstance(info.get("error"), ArborError) else "arbor infrastructure error"
        sid = info.get("state_id")
        if name == "bash":
            text = render_bash(action["cmd"], obs, info)
            self.log.setdefault(sid, "$ " + _first_line(action["cmd"]))
        elif name == "read_file":
            text = render_read(obs, info)
        elif name == "write_file":
            text = render_write(action["path"], action["content"], obs, info)
            self.log.setdefault(sid, "write_file " + action["path"])
        else:
            text = _text(obs.get("stdout")) or _text(obs.get("stderr"))
            if obs.get("exit_code"):
                text = "error: " + (_text(obs.get("stderr")).strip() or text) + " (call list_states for the states you can restore)"
        res.state_ids.append(sid)
        return text


def _bash(args: Dict[str, Any]) -> Dict[str, Any]:
    a: Dict[str, Any] = {"tool": "bash", "cmd": str(args.get("cmd", ""))}
    if isinstance(args.get("timeout_s"), (int, float)) and not isinstance(args.get("timeout_s"), bool):
        a["timeout_s"] = float(args["timeout_s"])
    return a


async def run_agent(env: AsyncEnv, chat: ChatClient, max_turns: Optional[int] = None, reset: bool = True,
                    seed: Optional[int] = None, system_prompt: str = SYSTEM_PROMPT,
                    fork_at: Optional[Dict[int, int]] = None, tools: Optional[List[str]] = None,
                    on_turn: Optional[Callable[[AgentResult], None]] = None) -> List[AgentResult]:
    """Runs the model behind chat as an agent on env until it submits,
    answers without a tool call, reaches max_turns env turns (default: the
    task's), or an infra failure masks the episode. Returns the
    trajectories: one, or with fork_at={turn: k} one per leaf of the fork
    tree (at each listed turn the episode is branched k ways, the children
    continue concurrently with copies of the conversation, and the branched
    env stops there). Children envs are closed at the end; env is not."""
    server_tools = env.client.capabilities.get("tools")
    schemas = tool_schemas(server_tools if isinstance(server_tools, list) else None, tools)
    run = _Run(env, chat, schemas, max_turns)
    res = AgentResult(env.env_id, [])
    if reset:
        try:
            obs, info = await run.ep.reset(seed=seed)
        except ArborError as e:
            if not e.infra:
                raise
            res.masked, res.mask_reason, res.end = True, "%s: %s" % (e.code, e.message), "masked"
            return [res]
        instruction = _text(obs.get("instruction") or obs.get("stdout"))
    else:
        run.ep.start()
        instruction = ""
    res.env_id = env.env_id
    res.state_ids = [env.state_id]
    res.messages = [{"role": "system", "content": system_prompt}]
    if instruction:
        res.messages.append({"role": "user", "content": instruction})
    return await _loop(run, res, dict(fork_at or {}), on_turn, owned=False)


async def _loop(run: _Run, res: AgentResult, fork_at: Dict[int, int], on_turn: Any, owned: bool) -> List[AgentResult]:
    ep = run.ep
    loop = asyncio.get_running_loop()
    try:
        while not ep.done:
            k = fork_at.pop(len(ep.trajectory.turns), None)
            if k and k > 1:
                return await _fork(run, res, k, fork_at, on_turn)
            t0 = time.monotonic()
            try:
                msg = await loop.run_in_executor(None, run.chat.complete, res.messages, run.tools)
            except ChatError as e:
                res.llm_s += time.monotonic() - t0
                ep._mask(ArborError("llm_failed", str(e), retryable=True, infra=True))
                break
            res.llm_s += time.monotonic() - t0
            assistant = {"role": "assistant", "content": msg.get("content")}
            calls = msg.get("tool_calls") or []
            if calls:
                assistant["tool_calls"] = calls
            res.messages.append(assistant)
            if not calls:
                await ep._finish("stop")
                break
            for call in calls:
                fn = call.get("function") or {}
                name = fn.get("name") or ""
                try:
                    args = json.loads(fn.get("arguments") or "{}")
                    if not isinstance(args, dict):
                        raise ValueError("arguments are not a JSON object")
                except ValueError as e:
                    text, args = "error: the arguments of %s are not valid JSON: %s" % (name, e), {}
                else:
                    if ep.done:
                        text = "not run: the episode is over (%s)" % ep.trajectory.end
                    else:
                        t0 = time.monotonic()
                        text = await run.call_tool(name, args, res)
                        res.env_s += time.monotonic() - t0
                res.messages.append({"role": "tool", "tool_call_id": call.get("id"), "content": text})
                res.calls.append(AgentTurn(name, args, text, run.env.state_id, run.env.turn))
            if on_turn is not None:
                on_turn(res)
        t = ep.trajectory
        res.reward, res.masked, res.mask_reason, res.end = t.reward, t.masked, t.mask_reason, t.end
        return [res]
    finally:
        if owned:
            try:
                await run.env.close()
            except ArborError:
                pass


async def _fork(run: _Run, res: AgentResult, k: int, fork_at: Dict[int, int], on_turn: Any) -> List[AgentResult]:
    try:
        kids = await run.env.branch(k, allow_partial=True)
    except ArborError as e:
        if not e.infra:
            raise
        run.ep._mask(e)
        res.reward, res.masked, res.mask_reason, res.end = None, True, run.ep.trajectory.mask_reason, "masked"
        return [res]
    jobs = []
    for i, kid in enumerate(kids):
        child_res = copy.deepcopy(res)
        child_res.env_id = kid.env_id if kid is not None else None
        child_res.fork_path = res.fork_path + [i]
        if kid is None:
            child_res.masked, child_res.mask_reason, child_res.end = True, "branch child %d failed" % i, "masked"
            jobs.append(_done(child_res))
            continue
        child = _Run(kid, run.chat, run.tools, run.ep.max_turns)
        child.log = dict(run.log)
        child.ep.trajectory = copy.deepcopy(run.ep.trajectory)
        child.ep.trajectory.env_id = kid.env_id
        jobs.append(_loop(child, child_res, dict(fork_at), on_turn, owned=True))
    out: List[AgentResult] = []
    for leaves in await asyncio.gather(*jobs):
        out.extend(leaves)
    return out


async def _done(r: AgentResult) -> List[AgentResult]:
    return [r]
