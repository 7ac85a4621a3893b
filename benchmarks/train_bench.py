"""Does the reward rise: GRPO on the basics env's ``run_script`` with the embedded model.

    PYTHONPATH=. python benchmarks/train_bench.py [--steps 24] [--samples 8] [--model-config embedded]

Runs ``launcher.py train`` (``rollout.cli.train.train``): a held-out greedy evaluation on every
basics case, ``--steps`` GRPO steps of ``--samples`` sessions of ``run_script`` each (launcher jobs
through the gateway, in the sandbox, graded by basics' rule evaluator; lr 5e-6, beta 0, 48 new
tokens per call), the evaluation again; prints a line per step, then the curve as a table, the
first and last quarter's pass rate, the evaluation before and after, and the seconds per step.
The full run takes about 30 minutes on 2 idle cores: measure it on a quiet machine. ``--steps 2
--samples 2 --model-config tiny`` checks that it runs (seconds)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from rollout.cli.train import TrainArgs, train


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--model-config", choices=["embedded", "tiny"], default="embedded")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    start = time.monotonic()
    result = train(TrainArgs(env="basics", cases=["run_script"], steps=a.steps, samples=a.samples,
                             model_config=a.model_config, max_new_tokens=a.max_new_tokens, out=a.out))
    history = result["history"]
    print("\nstep  pass rate  mean reward  seconds")
    for i, h in enumerate(history, 1):
        print(f"{i:4d}  {h.pass_rate:9.2f}  {h.mean_reward:11.2f}  {h.seconds:7.1f}")
    q = max(1, len(history) // 4)
    first = sum(h.pass_rate for h in history[:q]) / q
    last = sum(h.pass_rate for h in history[-q:]) / q
    print(f"pass rate, first {q} step(s) {first:.2f} -> last {q} step(s) {last:.2f}")
    for when, (mean, rate, n) in result["evals"].items():
        print(f"held-out {when}: pass rate {rate:.2f}, mean reward {mean:.2f} ({n} samples)")
    per_step = sum(h.seconds for h in history) / len(history)
    print(f"{per_step:.1f} s per step, {time.monotonic() - start:.0f} s in all; curve: {result['png']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
