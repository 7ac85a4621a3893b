"""Does the reward rise: GRPO (TRL) on the basics env's run_script with the embedded model.

    PYTHONPATH=. python benchmarks/train_bench.py [--steps 16] [--samples 8] [--model-config embedded]
                                                  [--max-new-tokens 48] [--out DIR] [--quick] [--json PATH]

Runs ``launcher.py train`` (``rollout.cli.train.train``): a held-out greedy evaluation on every
basics case, ``--steps`` GRPO steps of ``--samples`` sessions of ``run_script`` each (launcher jobs
through the gateway, in the sandbox, graded by basics' rule evaluator; lr 5e-6, beta 0), the
evaluation again. Prints a line per step, then the curve as a table, the first and last quarter's
pass rate, the evaluation before and after, and the seconds per step. The full run took 50 minutes
on 2 cores shared with other work (181 s a step; docs/training.md has its figures). ``--quick`` (2 steps of 2 samples on the
tiny model built in memory) checks that it runs, in seconds.
"""

from __future__ import annotations

import time
from pathlib import Path

import _bench

from rollout.cli.train import TrainArgs, train


def main() -> None:
    ap = _bench.parser(__doc__, quick={"steps": 2, "samples": 2, "model_config": "tiny"})
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--model-config", choices=["embedded", "tiny"], default="embedded")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    report = _bench.Report("train_bench", args)
    start = time.monotonic()
    result = train(
        TrainArgs(
            env="basics",
            cases=["run_script"],
            steps=args.steps,
            samples=args.samples,
            model_config=args.model_config,
            max_new_tokens=args.max_new_tokens,
            out=args.out,
        )
    )
    history = result["history"]
    curve = _bench.Table(
        f"GRPO on basics run_script, {args.samples} samples per step ({args.model_config} model)",
        [
            "step",
            ("pass rate", ".2f"),
            ("mean reward", ".2f"),
            "disagreeing groups",
            "tokens trained",
            "dropped",
            ("seconds", ".1f"),
        ],
    )
    for i, h in enumerate(history, 1):
        curve.add(
            str(i), h.pass_rate, h.mean_reward, h.disagreeing_groups, h.tokens_trained, h.dropped, h.seconds
        )
    report.table(curve)
    q = max(1, len(history) // 4)
    first = report.value("first_quarter_pass_rate", sum(h.pass_rate for h in history[:q]) / q)
    last = report.value("last_quarter_pass_rate", sum(h.pass_rate for h in history[-q:]) / q)
    report.line(f"pass rate, first {q} step(s) {first:.2f} -> last {q} step(s) {last:.2f}")
    evals = _bench.Table(
        "held-out evaluation (greedy, every basics case)",
        ["when", ("pass rate", ".2f"), ("mean reward", ".2f"), "samples"],
    )
    for when, (mean, rate, n) in result["evals"].items():
        evals.add(when, rate, mean, n)
    report.table(evals)
    per_step = report.value("seconds_per_step", sum(h.seconds for h in history) / len(history))
    report.line(f"{per_step:.1f} s per step, {time.monotonic() - start:.0f} s in all; curve: {result['png']}")
    report.finish()


if __name__ == "__main__":
    main()
