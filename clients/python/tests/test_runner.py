"""The episode runner end to end: a scripted OpenAI-compatible endpoint
(tests/fakeopenai.py, no model) drives an agent on a real `arbor serve`
(the server of test_e2e, with its token)."""

import re
import unittest

import arbor_env as arbor
from tests import test_e2e
from tests.fakeopenai import FakeOpenAI, call

GREET = 'echo "$GREETING" > /work/hello/greeting.txt'


def setUpModule():
    test_e2e.setUpModule()


def tearDownModule():
    test_e2e.tearDownModule()


def _n(body):
    return sum(1 for m in body["messages"] if m["role"] == "assistant")


def _tool_texts(body):
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


class RunnerTest(unittest.TestCase):
    def client(self):
        c = arbor.Client(test_e2e._server.url, token=test_e2e.TOKEN, timeout=120)
        if "hello" not in (c.capabilities.get("tasks") or []):
            c.close()
            self.skipTest("no hello task")
        return c

    def test_tools_rendering_and_submit(self):
        def script(body):
            n, texts = _n(body), _tool_texts(body)
            if n == 0:
                return {"content": None, "tool_calls": [call("bash", {"cmd": "cd /work/hello && echo base > base.txt"})]}
            if n == 1:
                return {"tool_calls": [call("write_file", {"path": "/work/hello/greeting.txt", "content": "wrong\n"})]}
            if n == 2:
                return {"tool_calls": [call("list_states", {})]}
            if n == 3:
                sid = re.search(r"state (\S+) \(turn 1\)", texts[0]).group(1)
                return {"tool_calls": [call("rollback", {"state_id": sid})]}
            if n == 4:
                return {"tool_calls": [call("fork_try", {"cmd": "rm -rf /work/hello; ls /work"})]}
            if n == 5:
                return {"tool_calls": [call("bash", {"cmd": "cat greeting.txt 2>&1; " + GREET}), call("bash", None, 1, raw="{not json")]}
            return {"tool_calls": [call("submit", {})]}

        llm = FakeOpenAI(script)
        try:
            with self.client() as c:
                env = c.env(task="hello")
                chat = arbor.ChatClient(llm.url, "scripted", api_key="sk-test")
                res, = c.run_agent(env, chat)
                self.assertEqual((res.end, res.reward, res.masked), ("submit", 1.0, False), (res.mask_reason, res.messages[-4:]))
                headers, body = llm.requests[0]
                self.assertEqual(headers.get("Authorization"), "Bearer sk-test")
                self.assertEqual(body["model"], "scripted")
                self.assertEqual([t["function"]["name"] for t in body["tools"]],
                                 ["bash", "read_file", "write_file", "list_states", "rollback", "fork_try", "submit"])
                self.assertEqual(body["messages"][1]["role"], "user")
                self.assertIn("greeting", body["messages"][1]["content"])
                texts = [m["content"] for m in res.messages if m["role"] == "tool"]
                self.assertTrue(texts[0].startswith("$ cd /work/hello && echo base > base.txt\n[exit code 0 · "), texts[0])
                self.assertRegex(texts[0], r"cwd /work/hello · state \S+ \(turn 1\)\]$")
                self.assertRegex(texts[1], r"^wrote 6 bytes to /work/hello/greeting.txt · state \S+ \(turn 2\)$")
                sid1 = re.search(r"state (\S+) \(turn 1\)", texts[0]).group(1)
                self.assertIn(sid1, texts[2])
                self.assertIn("<- current", texts[2])
                self.assertIn("$ cd /work/hello", texts[2])
                self.assertFalse(texts[3].startswith("error"), texts[3])
                self.assertTrue(texts[4].startswith("(on a throwaway copy of state"), texts[4])
                self.assertIn("files changed: unknown", texts[4])
                # After the rollback, the wrong greeting is gone; the fork_try deleted nothing.
                self.assertIn("No such file", texts[5])
                self.assertIn("not valid JSON", texts[6])
                self.assertTrue(texts[7].startswith("submitted; reward 1.0"), texts[7])
                # State ids per turn: the start, bash, write_file, rollback, bash.
                self.assertEqual(len(res.state_ids), 5)
                self.assertEqual(res.state_ids[-1], env.state_id)
                self.assertEqual(res.state_ids[1], sid1)
                env.close()
        finally:
            llm.stop()

    def test_fork_groups(self):
        def script(body):
            n = _n(body)
            if n == 0:
                return {"tool_calls": [call("bash", {"cmd": "echo 1 >> /tmp/n"})]}
            if n == 1:
                return {"tool_calls": [call("bash", {"cmd": "echo 2 >> /tmp/n"})]}
            if n == 2:
                return {"tool_calls": [call("bash", {"cmd": GREET + "; wc -l < /tmp/n"})]}
            return {"tool_calls": [call("submit", {})]}

        llm = FakeOpenAI(script)
        try:
            with self.client() as c:
                env = c.env(task="hello")
                leaves = c.run_agent(env, arbor.ChatClient(llm.url, "scripted"), fork_at={1: 3})
                self.assertEqual(len(leaves), 3)
                self.assertEqual(sorted(tuple(r.fork_path) for r in leaves), [(0,), (1,), (2,)])
                ids = {r.env_id for r in leaves}
                self.assertEqual(len(ids), 3)
                self.assertNotIn(env.env_id, ids)
                prefix = leaves[0].messages[:4]
                for r in leaves:
                    self.assertEqual((r.reward, r.masked, r.end), (1.0, False, "submit"), (r.mask_reason, r.messages[-4:]))
                    self.assertEqual(r.messages[:4], prefix)
                    self.assertIn("2\n[exit code 0", [m["content"] for m in r.messages if m["role"] == "tool"][2])
                    self.assertEqual(r.state_ids[:2], leaves[0].state_ids[:2])  # the shared turn
                open_ids = {e["env_id"] for e in c.envs()}
                self.assertFalse(ids & open_ids, "fork children left open")
                env.close()
        finally:
            llm.stop()

    def test_llm_failure_masks_stop_and_max_turns(self):
        def failing(body):
            return 500 if _n(body) == 1 else {"tool_calls": [call("bash", {"cmd": "ls"})]}

        def stopping(body):
            return {"content": "I am done."}

        def looping(body):
            return {"tool_calls": [call("bash", {"cmd": "ls"})]}

        with self.client() as c:
            env = c.env(task="hello")
            for script, want in [(failing, ("masked", None, True)), (stopping, ("stop", 0.0, False)),
                                 (looping, ("max_turns", 0.0, False))]:
                llm = FakeOpenAI(script)
                try:
                    res, = c.run_agent(env, arbor.ChatClient(llm.url, "scripted"), max_turns=3)
                finally:
                    llm.stop()
                self.assertEqual((res.end, res.reward, res.masked), want, res.mask_reason)
                if res.masked:
                    self.assertIn("llm_failed", res.mask_reason)
                if res.end == "max_turns":
                    self.assertEqual(len(res.state_ids), 4)
            env.close()


if __name__ == "__main__":
    unittest.main()
