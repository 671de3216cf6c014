#!/usr/bin/env python3
"""Steps/s through the client: plain sequential steps, pipelined steps,
step_batch, the EnvPool (send/recv of the first finishers) with N envs, and
the episode wrapper's overhead per turn.

    python3 clients/python/bench.py                 # starts bin/arbor serve (root) on a temp state dir
    python3 clients/python/bench.py --url ws://127.0.0.1:7878/v1/ws [--token T] [--envs 64] [--seconds 10]
"""

import argparse
import asyncio
import os
import statistics
import sys
import time

import arbor_env as arbor


async def plain_sequential(envs, seconds, cmd):
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        for e in envs:
            await e.step(cmd)
            n += 1
    return n


async def pipelined(envs, seconds, cmd):
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        await asyncio.gather(*[e.step(cmd) for e in envs])
        n += len(envs)
    return n


async def batch(client, envs, seconds, cmd):
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        out = await client.step_batch([(e, cmd) for e in envs])
        assert not any(isinstance(o, arbor.ArborError) for o in out), out
        n += len(envs)
    return n


async def pool_loop(pool, seconds, cmd, min_results):
    n, end = 0, time.monotonic() + seconds
    pool.send([cmd] * len(pool.envs))
    while time.monotonic() < end:
        done = await pool.recv(min_results=min_results)
        assert all(r.error is None for r in done), [r.error for r in done if r.error]
        n += len(done)
        pool.send([cmd] * len(done), env_ids=[r.env_id for r in done])
    await pool.recv()
    return n


async def episode_overhead(env, turns, cmd):
    """Seconds per turn of env.step and of AsyncEpisode.step on the same env."""
    ep = arbor.AsyncEpisode(env, max_turns=10 ** 9, evaluate=False)
    ep.start()
    plain = wrapped = 0.0
    for _ in range(turns):  # interleaved, so that both see the same server
        t0 = time.monotonic()
        await env.step(cmd)
        t1 = time.monotonic()
        await ep.step(cmd)
        t2 = time.monotonic()
        plain, wrapped = plain + t1 - t0, wrapped + t2 - t1
    return plain / turns, wrapped / turns


async def main(args):
    async with arbor.AsyncClient(args.url, token=args.token, timeout=600) as c:
        pool = await arbor.AsyncEnvPool.make(c, args.envs, image="busybox", fork=True)
        envs = pool.envs
        cmd = args.cmd
        rows = []
        for name, fn in [
            ("plain client, sequential", lambda: plain_sequential(envs, args.seconds, cmd)),
            ("plain client, pipelined (gather per round)", lambda: pipelined(envs, args.seconds, cmd)),
            ("step_batch of %d" % len(envs), lambda: batch(c, envs, args.seconds, cmd)),
            ("pool, recv(min_results=1)", lambda: pool_loop(pool, args.seconds, cmd, 1)),
            ("pool, recv(min_results=%d)" % max(1, len(envs) // 4), lambda: pool_loop(pool, args.seconds, cmd, max(1, len(envs) // 4))),
        ]:
            t0 = time.monotonic()
            n = await fn()
            dt = time.monotonic() - t0
            rows.append((name, n, n / dt))
            print("%-45s %6d steps %8.1f steps/s" % (name, n, n / dt), flush=True)
        per = [await episode_overhead(envs[0], args.turns, cmd) for _ in range(3)]
        plain = statistics.median(p for p, _ in per)
        wrapped = statistics.median(w for _, w in per)
        print("episode wrapper: %.2f ms/turn plain step, %.2f ms/turn through AsyncEpisode (+%.3f ms)"
              % (plain * 1e3, wrapped * 1e3, (wrapped - plain) * 1e3))
        # The episode runner: a local scripted chat endpoint answering one
        # bash call per request; overhead = wall time per turn minus the
        # endpoint's and a plain step's.
        from tests.fakeopenai import FakeOpenAI, call

        llm = FakeOpenAI(lambda body: {"tool_calls": [call("bash", {"cmd": cmd})]})
        try:
            env = pool.envs[1]
            env.task = None
            t0 = time.monotonic()
            res, = await arbor.run_agent(env, arbor.ChatClient(llm.url, "scripted"), max_turns=args.turns, reset=False)
            wall = time.monotonic() - t0
            turns = len(res.calls)
            print("episode runner: %d turns, %.2f ms/turn wall, %.2f ms/turn in the chat endpoint, %.2f ms/turn in tools "
                  "(plain step %.2f ms): runner overhead %.2f ms/turn"
                  % (turns, wall / turns * 1e3, res.llm_s / turns * 1e3, res.env_s / turns * 1e3, plain * 1e3,
                     (wall - res.llm_s) / turns * 1e3 - plain * 1e3))
        finally:
            llm.stop()
        await pool.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url")
    ap.add_argument("--token", default=os.environ.get("ARBOR_TOKEN") or None)
    ap.add_argument("--envs", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--turns", type=int, default=50)
    ap.add_argument("--cmd", default="true")
    args = ap.parse_args()
    srv = None
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # tests/: the server launcher, the scripted endpoint
    if args.url is None:
        from tests.test_e2e import Server  # the test suite's `arbor serve` launcher

        srv = Server(extra=["--max-envs", str(max(256, args.envs + 8))])
        args.url = srv.url
    try:
        asyncio.run(main(args))
    finally:
        if srv is not None:
            srv.stop()
