#!/usr/bin/env python3
"""Cost per step of the OpenEnv paths against protocol v1, from Python
(docs/openenv.md, "Overhead"): N `echo hi` steps, interleaved, through

- v1: arbor_env.Client, env.step (msgpack-rpc at /v1/ws);
- openenv: the endpoint /openenv/TASK/ws, with the client of
  tests/openenv_client.py (written from OpenEnv's env_client.py: JSON text
  messages, one answer awaited per call);
- sandbox: ArborSandboxBackend's exec (v1 underneath, the command wrapped
  in a subshell for its cwd and envs).

    python3 clients/python/bench_openenv.py [--steps 200]   # root; starts bin/arbor serve

It serves a task of its own (busybox, no max_turns, so no episode ends
mid-run) from a temporary tasks dir.
"""

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import arbor_env as arbor  # noqa: E402
from arbor_env.sandbox import ArborSandboxBackend  # noqa: E402
from tests.openenv_client import GenericEnvClient  # noqa: E402
from tests.test_e2e import Server  # noqa: E402


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    a = ap.parse_args()
    tasks = tempfile.mkdtemp(prefix="arbor-bench-tasks-")
    with open(os.path.join(tasks, "bench.yaml"), "w") as f:
        f.write("name: bench\nimage: busybox\nsetup:\n  - mkdir -p /work && cd /work\ninstruction: benchmark\n")
    srv = Server(extra=["--tasks", tasks])
    loop = asyncio.new_event_loop()
    try:
        c = arbor.Client(srv.url, timeout=120)
        env = c.env(task="bench")
        env.reset()
        oe = GenericEnvClient("http://127.0.0.1:%d/openenv/bench" % srv.port)
        loop.run_until_complete(oe.connect())
        loop.run_until_complete(oe.reset())
        sb = ArborSandboxBackend(client=c, task="bench").create()
        step = {"tool": "bash", "cmd": "echo hi"}
        times = {"v1": [], "openenv": [], "sandbox": []}
        for i in range(a.steps + 5):
            t = time.perf_counter()
            obs = env.step("echo hi")[0]
            t1 = time.perf_counter()
            r = loop.run_until_complete(oe.step(step))
            t2 = time.perf_counter()
            x = sb.exec("echo hi")
            t3 = time.perf_counter()
            assert obs["stdout"] == r.observation["stdout"] == x.stdout == "hi\n", (obs, r, x)
            if i >= 5:  # warm-up
                times["v1"].append(t1 - t)
                times["openenv"].append(t2 - t1)
                times["sandbox"].append(t3 - t2)
        base = statistics.median(times["v1"])
        print("%d steps of `echo hi` each, interleaved (ms):" % a.steps)
        print("%-9s %8s %8s %8s %14s" % ("path", "p50", "p90", "p99", "p50 - v1 p50"))
        for k, v in times.items():
            print("%-9s %8.2f %8.2f %8.2f %+14.2f" % (k, 1e3 * statistics.median(v), 1e3 * pct(v, .9), 1e3 * pct(v, .99),
                                                    1e3 * (statistics.median(v) - base)))
        loop.run_until_complete(oe.close())
        sb.kill()
        env.close()
        c.close()
    finally:
        loop.close()
        srv.stop()


if __name__ == "__main__":
    main()
