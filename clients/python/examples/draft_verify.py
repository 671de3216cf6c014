#!/usr/bin/env python3
"""A draft/verify (speculative) loop against an Arbor server.

At every turn the drafter proposes an action; it runs on branch(1) of the
live env, not on the env itself. A verifier then judges the draft: the
task's verifier through evaluate(), with a finer partial score while the
task is unsolved (score went up, or stayed and the command succeeded),
accepts it and promote() makes the draft the env's new
state; otherwise discard() throws it away and the env is exactly as before
the draft (files, shell state and processes). The drafter here is a
scripted list of candidates, some wrong, for the python-fizzbuzz task;
replace `drafts()` with a small fast model and `accept()` with a larger one.

    make run                                  # in the repo root: server on 127.0.0.1:7878
    python3 clients/python/examples/draft_verify.py [--task python-fizzbuzz]
"""

import argparse
import os
import time

from arbor_env import Client

FIZZ_WRONG = '''def fizzbuzz(n):
    if n % 3 == 0:
        return "Fizz"
    if n % 5 == 0:
        return "Buzz"
    if n % 15 == 0:
        return "FizzBuzz"
    return str(n)
'''

FIZZ_RIGHT = '''def fizzbuzz(n):
    if n % 15 == 0:
        return "FizzBuzz"
    if n % 3 == 0:
        return "Fizz"
    if n % 5 == 0:
        return "Buzz"
    return str(n)
'''


def drafts(task):
    """Candidate actions, in the order a drafter would propose them."""
    if task == "python-fizzbuzz":
        return [
            "cd /work/fizz && cat fizz.py",
            "rm -f fizz.py",  # destructive: the verifier must reject it
            {"tool": "write_file", "path": "/work/fizz/fizz.py", "content": FIZZ_WRONG},
            "export FIZZ_DEBUG=1",
            {"tool": "write_file", "path": "/work/fizz/fizz.py", "content": FIZZ_RIGHT},
            "python3 -c 'from fizz import fizzbuzz; print([fizzbuzz(i) for i in range(1, 16)])'",
        ]
    # hello (busybox)
    return [
        "cd /work/hello && cat README",
        "echo hello > greeting.txt",
        'echo "$GREETING" > /work/hello/greeting.txt',
        "cat /work/hello/greeting.txt",
    ]


# A finer score than the task's pass/fail verifier, for drafts that do not
# finish the task yet: the share of fizzbuzz(1..100) already right (a
# stand-in for a larger model judging the draft).
PARTIAL = {
    "python-fizzbuzz": "cd /work/fizz && python3 -c \"from fizz import fizzbuzz as f; "
    "print(sum(f(n) == ('FizzBuzz' if n % 15 == 0 else 'Fizz' if n % 3 == 0 else 'Buzz' if n % 5 == 0 else str(n)) "
    "for n in range(1, 101)) / 100)\"",
    "hello": "test -d /work/hello && echo 0.5 || echo 0",
}


def score(env, task):
    """The task's reward if it is solved, else the partial score, measured
    on a throwaway branch so that env itself is not touched."""
    reward, _ = env.evaluate()
    if reward >= 1.0 or task not in PARTIAL:
        return reward
    (probe,) = env.branch(1)
    obs, _, _, _, _ = probe.step(PARTIAL[task])
    probe.discard()
    try:
        return float(obs["stdout"].strip().splitlines()[-1]) * 0.99
    except (ValueError, IndexError):
        return 0.0


def accept(before, after, obs):
    """The verifier's rule: never lose score; keep neutral steps that ran fine."""
    return after > before or (after == before and obs["exit_code"] == 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default=os.environ.get("ARBOR_URL", "ws://127.0.0.1:7878/v1/ws"))
    ap.add_argument("--task", default="python-fizzbuzz")
    args = ap.parse_args()
    start = time.time()
    with Client(args.url, token=os.environ.get("ARBOR_TOKEN") or None) as client:
        env, obs, info = client.make(task=args.task)
        print("task:", obs.get("instruction", "").strip().splitlines()[0])
        reward = score(env, args.task)
        for action in drafts(args.task):
            (draft,) = env.branch(1)  # the draft runs on a copy
            obs, _, _, _, info = draft.step(action)
            after = score(draft, args.task)
            label = action if isinstance(action, str) else f"write_file {action['path']}"
            if accept(reward, after, obs):
                sid = draft.promote()  # the env adopts the draft's state
                print(f"accept  {label!r}: score {reward:.2f} -> {after:.2f} (state {sid})")
                reward = after
            else:
                draft.discard()  # the env never saw it
                print(f"reject  {label!r}: score would be {after:.2f}, exit {obs['exit_code']}")
            if reward >= 1.0:
                break
        final, _ = env.evaluate()
        print(f"final reward (task verifier) {final:.2f} after {time.time() - start:.1f} s")
        env.close()


if __name__ == "__main__":
    main()
