#!/usr/bin/env python3
"""Tree-GRPO-style rollouts against an Arbor server.

Grows M rollout trees per task. Each tree starts from one reset; L times,
it picks N random nodes (any turn of any trajectory in the tree) and forks
each into K children with branch(K), which continue with their own sampled
actions. Leaves are scored with finish() (evaluate with fork=False: the
task's verifier in the server's trusted grader, then the leaf is closed in
the same request; --forked-eval scores with evaluate() and closes after)
and advantages are computed group-relative per tree, as in GRPO. No prefix is ever replayed: a child starts from its parent's state,
files, shell and processes included.

The "policy" here samples from a small menu of shell actions for the
sort-numbers task, so that the example runs without a model; replace
`policy()` with your LLM call.

    make run                                  # in the repo root: server on 127.0.0.1:7878
    python3 clients/python/examples/tree_grpo.py [--trees 2] [--k 3] [--rounds 2] [--expand 2]
"""

import argparse
import asyncio
import os
import random
import statistics
import time

from arbor_env import AsyncClient

# Actions for the sort-numbers task (busybox): some help, some hurt.
MENU = [
    "cat numbers.txt",
    "sort numbers.txt > sorted.txt",
    "sort -n numbers.txt > sorted.txt",
    "sort -rn numbers.txt > sorted.txt",
    "head -n 4 numbers.txt | sort -n > sorted.txt",
    "sort -n numbers.txt | uniq > sorted.txt",
    "cd /work/sort",
    "ls -la",
]


def policy(rng, history):
    """Stand-in for the model: an action given the trajectory so far."""
    return rng.choice(MENU)


class Node:
    def __init__(self, state_id, depth, actions):
        self.state_id = state_id  # the state after this node's last action
        self.depth = depth
        self.actions = actions  # from the root: what a replay would re-run
        self.children = []


async def grow_tree(client, task, rng, k, rounds, expand, steps, forked_eval=False):
    root_env = client.env(task=task)
    obs, info = await root_env.reset()
    root = Node(root_env.state_id, 0, [])
    nodes = [root]
    # A first trajectory, so that there are inner nodes to expand.
    node = root
    for _ in range(steps):
        a = policy(rng, node.actions)
        await root_env.step(a)
        child = Node(root_env.state_id, node.depth + 1, node.actions + [a])
        node.children.append(child)
        nodes.append(child)
        node = child
    envs = [root_env]
    leaves = [node]
    saved = 0
    t0 = time.time()
    for _ in range(rounds):
        picks = [rng.choice(nodes) for _ in range(expand)]

        async def expand_node(parent):
            nonlocal saved
            forks = await client.branch_state(parent.state_id, k)  # k-way fork, no replay
            saved += k * len(parent.actions)
            envs.extend(forks)
            grown = []

            async def rollout(env):
                n = parent
                for _ in range(steps):
                    a = policy(rng, n.actions)
                    await env.step(a)
                    c = Node(env.state_id, n.depth + 1, n.actions + [a])
                    n.children.append(c)
                    n = c
                    grown.append(c)
                if forked_eval:
                    reward, details = await env.evaluate()
                    await env.close()
                else:
                    reward, details = await env.finish()  # a finished leaf: graded and closed
                return n, reward

            results = await asyncio.gather(*(rollout(e) for e in forks))
            return grown, results

        for grown, results in await asyncio.gather(*(expand_node(p) for p in picks)):
            nodes.extend(grown)
            for leaf, reward in results:
                leaf.reward = reward
                leaves.append(leaf)
    expansion = time.time() - t0
    # The first trajectory's leaf is scored on the root env.
    leaves[0].reward, _ = await root_env.evaluate()
    for e in envs:
        await e.close()
    return root, nodes, leaves, saved, expansion


async def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default=os.environ.get("ARBOR_URL", "ws://127.0.0.1:7878/v1/ws"))
    ap.add_argument("--task", default="sort-numbers")
    ap.add_argument("--trees", type=int, default=2, help="M: trees (one GRPO group each)")
    ap.add_argument("--k", type=int, default=3, help="K: children per expanded node (branching factor)")
    ap.add_argument("--rounds", type=int, default=2, help="L: expansion rounds")
    ap.add_argument("--expand", type=int, default=2, help="N: nodes expanded per round")
    ap.add_argument("--steps", type=int, default=2, help="actions per new branch")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--forked-eval", action="store_true", help="score leaves with evaluate() then close, not finish()")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    start = time.time()
    async with AsyncClient(args.url, token=os.environ.get("ARBOR_TOKEN") or None) as client:
        trees = await asyncio.gather(*(
            grow_tree(client, args.task, random.Random(rng.random()), args.k, args.rounds, args.expand, args.steps,
                      args.forked_eval)
            for _ in range(args.trees)))
    total_saved, expansions = 0, []
    for i, (root, nodes, leaves, saved, expansion) in enumerate(trees):
        expansions.append(expansion)
        rewards = [leaf.reward for leaf in leaves]
        mean = statistics.mean(rewards)
        std = statistics.pstdev(rewards) or 1.0
        print(f"tree {i}: {len(nodes)} nodes, {len(leaves)} leaves, mean reward {mean:.3f}")
        for leaf in sorted(leaves, key=lambda n: -n.reward)[:3]:
            adv = (leaf.reward - mean) / std
            print(f"  reward {leaf.reward:.3f} advantage {adv:+.2f}: {' ; '.join(leaf.actions)}")
        total_saved += saved
    print(f"{time.time() - start:.1f} s (expansion phase {max(expansions):.1f} s, leaves scored with "
          f"{'evaluate + close' if args.forked_eval else 'finish'}); "
          f"{total_saved} prefix actions not re-executed thanks to branch()")


if __name__ == "__main__":
    asyncio.run(main())
