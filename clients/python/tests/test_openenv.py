"""OpenEnv against a real `arbor serve` (started with a token, as in
test_e2e): the endpoint /openenv/TASK spoken by tests/openenv_client.py (an
independent client written from OpenEnv's env_client.py), and the
SandboxBackend of arbor_env.sandbox, checked against the signatures of
OpenEnv's sandbox protocol. See docs/openenv.md."""

import asyncio
import base64
import inspect
import json
import time
import unittest
import urllib.error
import urllib.request

import arbor_env as arbor
from arbor_env.sandbox import ArborBgJob, ArborSandbox, ArborSandboxBackend, ExecResult
from tests.openenv_client import GenericEnvClient
from tests.test_e2e import Server

TOKEN = "openenv-token"
_server = None


def setUpModule():
    global _server
    _server = Server(token=TOKEN)


def tearDownModule():
    if _server is not None:
        _server.stop()


def base_url(task="hello", token=TOKEN):
    # OpenEnv's client sends no header of its own: the token rides in the
    # URL's user info, which websockets sends as Basic credentials.
    cred = "arbor:%s@" % token if token else ""
    return "http://%s127.0.0.1:%d/openenv/%s" % (cred, _server.port, task)


def run(coro):
    return asyncio.run(coro)


def get(path, token=TOKEN):
    req = urllib.request.Request("http://127.0.0.1:%d/openenv/hello/%s" % (_server.port, path))
    if token:
        req.add_header("Authorization", "Basic " + base64.b64encode(("arbor:" + token).encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, None


class OpenEnvEndpointTest(unittest.TestCase):
    def test_http_routes(self):
        self.assertEqual(get("health"), (200, {"status": "healthy"}))
        code, schema = get("schema")
        self.assertEqual(code, 200)
        self.assertEqual(set(schema), {"action", "observation", "state"})
        code, md = get("metadata")
        self.assertEqual((code, md["name"]), (200, "hello"))
        self.assertIsInstance(md["description"], str)
        self.assertEqual(get("health", token=None)[0], 401)
        self.assertEqual(get("health", token="wrong")[0], 401)

    def test_episode_branch_rollback_submit(self):
        async def go():
            env = GenericEnvClient(base_url())
            async with env:
                r = await env.reset(seed=3)
                self.assertIn("greeting", r.observation["instruction"])
                self.assertIsNone(r.reward)
                self.assertFalse(r.done)
                md = r.observation["metadata"]
                session, first = md["session_id"], md["state_id"]
                self.assertEqual((md["turn"], md["task"], md["max_turns"]), (0, "hello", 10))

                r = await env.step({"tool": "bash", "cmd": "echo $ARBOR_SEED; pwd"})
                self.assertEqual(r.observation["stdout"], "3\n/work/hello\n")
                self.assertEqual(r.observation["exit_code"], 0)
                self.assertIsNone(r.reward)
                self.assertFalse(r.done)
                self.assertNotEqual(r.observation["metadata"]["state_id"], first)
                r = await env.step({"tool": "write_file", "path": "greeting.txt", "content": "hello, arbor\n"})
                made = r.observation["metadata"]["state_id"]
                r = await env.step({"tool": "read_file", "path": "greeting.txt"})
                self.assertEqual(r.observation["stdout"], "hello, arbor\n")
                st = await env.state()
                self.assertEqual((st["episode_id"], st["step_count"], st["session_id"]), (session, 3, session))

                # Extensions: branch, attach to a child, rollback, states.
                br = (await env.call("branch", {"n": 2}))["data"]
                self.assertEqual(len(br["sessions"]), 2)
                # A child's own base URL: a plain OpenEnv client attaches by it.
                self.assertEqual(br["base_paths"][1], "/openenv/hello/session/" + br["sessions"][1])
                kid = GenericEnvClient(base_url() + "/session/" + br["sessions"][0])
                async with kid:
                    r = await kid.step({"tool": "bash", "cmd": "cat greeting.txt; echo bye > greeting.txt"})
                    self.assertEqual(r.observation["stdout"], "hello, arbor\n")
                    self.assertEqual(r.observation["metadata"]["session_id"], br["sessions"][0])
                    r = await kid.step({"tool": "submit"})
                    self.assertEqual((r.reward, r.done), (0.0, True))
                kid1 = GenericEnvClient(base_url(), ws_suffix="?session=" + br["sessions"][1])
                async with kid1:
                    st = await kid1.state()
                    self.assertEqual((st["session_id"], st["state_id"]), (br["sessions"][1], br["state_id"]))
                r = await env.step({"tool": "bash", "cmd": "cat greeting.txt"})
                self.assertEqual(r.observation["stdout"], "hello, arbor\n", "the parent saw its child's change")
                await env.step({"tool": "bash", "cmd": "rm greeting.txt"})
                rb = (await env.call("rollback", {"state_id": made}))["data"]
                self.assertEqual(rb["state_id"], made)
                states = (await env.call("states"))["data"]
                self.assertEqual(states["head"], made)
                self.assertEqual(states["states"][-1]["state_id"], made)
                ev = (await env.call("evaluate"))["data"]
                self.assertEqual(ev["reward"], 1.0)
                self.assertIsInstance(ev["reward"], float)

                r = await env.step({"tool": "submit"})
                self.assertEqual((r.reward, r.done), (1.0, True))
                self.assertIsInstance(r.reward, float)
                self.assertTrue(r.observation["metadata"]["submitted"])
                with self.assertRaisesRegex(RuntimeError, r"episode is over .*\(code: EXECUTION_ERROR\)"):
                    await env.step({"tool": "bash", "cmd": "ls"})

                # A new episode on the same connection; max_turns ends it
                # with the verifier's reward.
                r = await env.reset()
                self.assertNotEqual(r.observation["metadata"]["session_id"], session)
                for i in range(10):
                    r = await env.step({"tool": "bash", "cmd": "true"})
                    self.assertEqual(r.done, i == 9, i)
                self.assertEqual(r.reward, 0.0)
                self.assertTrue(r.observation["metadata"]["max_turns_reached"])
                self.assertIn("exit_code", r.observation["metadata"]["evaluation"])
        run(go())

    def test_errors(self):
        async def go():
            env = GenericEnvClient(base_url())
            async with env:
                with self.assertRaisesRegex(RuntimeError, r"send reset first \(code: EXECUTION_ERROR\)"):
                    await env.step({"tool": "bash", "cmd": "ls"})
                await env.reset()
                with self.assertRaisesRegex(RuntimeError, r"action\.cmd: required string is missing \(code: VALIDATION_ERROR\)"):
                    await env.step({"tool": "bash"})
                with self.assertRaisesRegex(RuntimeError, r"\(code: VALIDATION_ERROR\)"):
                    await env.step({"tool": "telnet"})
                with self.assertRaisesRegex(RuntimeError, r"unknown message type \"dance\".*\(code: UNKNOWN_TYPE\)"):
                    await env.call("dance")
                with self.assertRaisesRegex(RuntimeError, r"\(code: EXECUTION_ERROR\)"):
                    await env.call("rollback", {"state_id": "snope"})
                await env._ws.send("{not json")
                a = json.loads(await env._ws.recv())
                self.assertEqual((a["type"], a["data"]["code"], a["data"]["arbor_code"], a["data"]["infra"]), ("error", "INVALID_JSON", "malformed", False))
                r = await env.step({"tool": "bash", "cmd": "echo still here"})
                self.assertEqual(r.observation["stdout"], "still here\n")
            for token in (None, "wrong"):
                with self.assertRaises(ConnectionError):
                    await GenericEnvClient(base_url(token=token)).connect()
            with self.assertRaises(ConnectionError):
                await GenericEnvClient(base_url(task="nope")).connect()
        run(go())


# The protocol of OpenEnv's harness layer, copied from
# src/openenv/core/sandbox/base.py of meta-pytorch/OpenEnv as the reference
# for the signatures (bodies dropped).
class RefBgJob:
    @property
    def pid(self) -> int: ...

    def wait(self, timeout: "float | None" = None) -> int: ...

    def kill(self) -> None: ...


class RefSandboxHandle:
    @property
    def sandbox_id(self) -> str: ...

    def exec(self, cmd: str, *, envs: "dict[str, str] | None" = None, cwd: "str | None" = None,
             timeout: "float | None" = 60) -> "ExecResult": ...

    def start_bg(self, cmd: str, *, envs: "dict[str, str] | None" = None, cwd: "str | None" = None) -> "RefBgJob": ...

    def write_text(self, path: str, content: str) -> None: ...

    def read_text(self, path: str) -> str: ...

    def exists(self, path: str) -> bool: ...

    def kill(self) -> None: ...


class RefSandboxBackend:
    def create(self, *, timeout_s: int = 900, envs: "dict[str, str] | None" = None,
               metadata: "dict[str, str] | None" = None) -> "RefSandboxHandle": ...


REF_EXEC_RESULT_FIELDS = ["exit_code", "stdout", "stderr"]


def _shape(fn):
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


class SandboxSignatureTest(unittest.TestCase):
    def test_signatures_match_openenv(self):
        for ref, ours in ((RefBgJob, ArborBgJob), (RefSandboxHandle, ArborSandbox), (RefSandboxBackend, ArborSandboxBackend)):
            for name, member in vars(ref).items():
                if name.startswith("_"):
                    continue
                got = inspect.getattr_static(ours, name, None)
                self.assertIsNotNone(got, "%s lacks %s" % (ours.__name__, name))
                if isinstance(member, property):
                    self.assertIsInstance(got, property, "%s.%s" % (ours.__name__, name))
                    continue
                self.assertEqual(_shape(getattr(ours, name)), _shape(member), "%s.%s" % (ours.__name__, name))
        self.assertEqual([f for f in ExecResult.__dataclass_fields__][:3], REF_EXEC_RESULT_FIELDS)


class SandboxBackendTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.backend = ArborSandboxBackend(_server.url, task="hello", token=TOKEN, timeout=120)

    @classmethod
    def tearDownClass(cls):
        cls.backend.close()

    def test_exec_files_and_jobs(self):
        sb = self.backend.create(envs={"MODE": "it's on"})
        try:
            self.assertTrue(sb.sandbox_id)
            r = sb.exec("echo \"$MODE\"; pwd")
            self.assertEqual((r.exit_code, r.stdout, r.stderr), (0, "it's on\n/work/hello\n", ""))
            r = sb.exec("echo $MODE $X; pwd; cd /; exit 4", envs={"X": "x y"}, cwd="/tmp")
            self.assertEqual((r.exit_code, r.stdout), (4, "it's on x y\n/tmp\n"))
            self.assertEqual(sb.exec("pwd; echo ${X:-unset}").stdout, "/work/hello\nunset\n", "cwd or envs leaked")
            r = sb.exec("echo oops >&2; false")
            self.assertEqual((r.exit_code, r.stderr), (1, "oops\n"))
            r = sb.exec("sleep 5", timeout=1)
            self.assertTrue(r.timed_out)
            self.assertNotEqual(r.exit_code, 0)

            text = "line 'one'\n\"two\" $HOME \\ ünï\n"
            sb.write_text("sub/dir/notes.txt", text)
            self.assertEqual(sb.read_text("sub/dir/notes.txt"), text)
            self.assertTrue(sb.exists("/work/hello/sub/dir"))
            self.assertFalse(sb.exists("no such file"))
            with self.assertRaises(FileNotFoundError):
                sb.read_text("no such file")

            job = sb.start_bg("sleep 0.3; echo done; echo err >&2; exit 3", envs={"Y": "1"}, cwd="/tmp")
            self.assertIsInstance(job.pid, int)
            self.assertEqual(job.wait(timeout=30), 3)
            self.assertEqual(sb.read_text(job.stdout_path), "done\n")
            self.assertEqual(sb.read_text(job.stderr_path), "err\n")
            long = sb.start_bg("sleep 300 & sleep 300; echo never")
            with self.assertRaises(TimeoutError):
                long.wait(timeout=0.5)
            long.kill()
            self.assertEqual(long.wait(timeout=30), 143)
            self.assertEqual(sb.exec("ps -o pid,args | grep -c '[s]leep 300'").stdout.strip(), "0", "the job's children survived kill")
        finally:
            sb.kill()
        sb.kill()  # twice is harmless
        self.assertClosed(sb)

    def assertClosed(self, sb):
        with self.assertRaises(arbor.ArborError) as cm:
            self.backend.client.call("step", {"env_id": sb.sandbox_id, "action": {"tool": "bash", "cmd": "true"}})
        self.assertEqual(cm.exception.code, "unknown_env")

    def test_fork_and_rollback(self):
        sb = self.backend.create(metadata={"task": "hello", "seed": "5"})
        kids = []
        try:
            sb.write_text("f", "base")
            base = sb.state_id
            job = sb.start_bg("i=0; while :; do i=$((i+1)); echo $i > /tmp/ticks; sleep 0.1; done")
            time.sleep(0.5)
            kids = sb.fork(2)
            self.assertEqual(len(kids), 2)
            for i, k in enumerate(kids):
                self.assertNotEqual(k.sandbox_id, sb.sandbox_id)
                self.assertEqual(k.read_text("f"), "base")
                k.write_text("f", "kid%d" % i)
                # The background job was forked with the sandbox and runs on.
                a = int(k.read_text("/tmp/ticks"))
                time.sleep(0.4)
                self.assertGreater(int(k.read_text("/tmp/ticks")), a)
            self.assertEqual([k.read_text("f") for k in kids], ["kid0", "kid1"])
            self.assertEqual(sb.read_text("f"), "base")
            self.assertEqual(sb.exec("echo $ARBOR_SEED").stdout, "5\n")
            job.kill()
            sb.write_text("f", "changed")
            sb.rollback(base)
            self.assertEqual(sb.state_id, base)
            self.assertEqual(sb.read_text("f"), "base")
        finally:
            for k in kids:
                k.kill()
            sb.kill()

    def test_lifetime(self):
        sb = self.backend.create(timeout_s=1)
        self.assertEqual(sb.exec("echo up").stdout, "up\n")
        time.sleep(2)
        self.assertClosed(sb)

    def test_image_and_no_source(self):
        with self.assertRaises(ValueError):
            ArborSandboxBackend(client=self.backend.client).create()
        sb = ArborSandboxBackend(client=self.backend.client, image="busybox").create()
        try:
            self.assertEqual(sb.exec("echo hi").stdout, "hi\n")
        finally:
            sb.kill()


if __name__ == "__main__":
    unittest.main()
