"""Does the reward rise on cases not trained on: GRPO (TRL) with the embedded model on the scripts env.

    PYTHONPATH=. python benchmarks/train_bench.py [--steps 16] [--samples 8] [--model-config embedded]
                                                  [--max-new-tokens 48] [--eval-samples 1] [--eval-every 0]
                                                  [--out DIR] [--quick] [--json PATH]

Runs the default ``launcher.py train`` (``rollout.cli.train.train``): the scripts env's train split
(5 instances) trained on, its eval split (12 other instances of the same skill, disjoint by
construction) evaluated before and after (greedy, or ``--eval-samples K`` sampled), ``--steps``
GRPO steps of ``--samples`` sessions (launcher jobs through the gateway, in the sandbox, graded by
the rule evaluator; lr 5e-6, beta 0). Prints a line per step, the curve as a table, the first and
last quarter's batch pass rate, and the held-out evaluation before and after with its standard
error over cases and n. ``--quick`` (2 steps of 2 samples on the tiny model built in memory, 2
eval cases) checks that it runs.
"""

from __future__ import annotations

import time
from pathlib import Path

import _bench

from rollout.cli.train import TrainArgs, train


def _pm(value: float | None, se: float | None) -> str:
    return "" if value is None else f"{value:.2f}" + ("" if se is None else f" ± {se:.2f}")


def main() -> None:
    ap = _bench.parser(
        __doc__,
        quick={"steps": 2, "samples": 2, "model_config": "tiny", "eval_cases": "measure-list,report-cells"},
    )
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--model-config", choices=["embedded", "tiny"], default="embedded")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--eval-samples", type=int, default=1)
    ap.add_argument("--eval-every", type=int, default=0)
    ap.add_argument("--eval-cases", default=None, help="comma-separated (default: the eval split)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    report = _bench.Report("train_bench", args)
    start = time.monotonic()
    result = train(
        TrainArgs(
            steps=args.steps,
            samples=args.samples,
            model_config=args.model_config,
            max_new_tokens=args.max_new_tokens,
            eval_samples=args.eval_samples,
            eval_every=args.eval_every,
            out=args.out,
            eval_cases=args.eval_cases.split(",") if args.eval_cases else None,
        )
    )
    history, split = result["history"], result["split"]
    curve = _bench.Table(
        f"GRPO on scripts' train split ({', '.join(split.train)}), {args.samples} samples per "
        f"step ({args.model_config} model)",
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
    report.line(
        f"batch pass rate (train cases), first {q} step(s) {first:.2f} -> last {q} step(s) {last:.2f}"
    )
    evals = _bench.Table(
        f"{split.label} evaluation on {len(split.eval)} eval cases (standard error over cases)",
        [
            "when",
            "step",
            "pass@1",
            *([f"pass@{args.eval_samples}"] if args.eval_samples > 1 else []),
            "mean reward",
            "n cases",
            "samples per case",
            "sampling",
        ],
    )
    for e in result["evals"]:
        at_k = [_pm(e.pass_at_k, e.pass_at_k_se)] if args.eval_samples > 1 else []
        evals.add(
            e.when,
            e.step,
            _pm(e.pass_rate, e.pass_rate_se),
            *at_k,
            _pm(e.mean_reward, e.mean_reward_se),
            e.cases,
            e.samples,
            "greedy" if e.temperature == 0 else f"T={e.temperature}",
        )
        report.value(f"eval_{e.when.replace(' ', '')}_pass_at_1", e.pass_rate)
    report.table(evals)
    before, after = result["evals"][0], result["evals"][-1]
    report.line(
        f"{split.label} pass@1 {_pm(before.pass_rate, before.pass_rate_se)} -> "
        f"{_pm(after.pass_rate, after.pass_rate_se)}, mean reward "
        f"{_pm(before.mean_reward, before.mean_reward_se)} -> {_pm(after.mean_reward, after.mean_reward_se)} "
        f"(n={after.cases} cases x {after.samples})"
    )
    per_step = report.value("seconds_per_step", sum(h.seconds for h in history) / len(history))
    report.line(f"{per_step:.1f} s per step, {time.monotonic() - start:.0f} s in all; curve: {result['png']}")
    report.finish()


if __name__ == "__main__":
    main()
