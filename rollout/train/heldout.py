"""What ``launcher.py train`` evaluates on, and how (docs/training.md, "The evaluation").

``choose_cases`` splits an env's cases into the trained cases and the evaluated ones: by default
the rows whose ``split`` field is ``train`` / ``eval`` (an env without the field: the trained
cases are ``--cases``, the evaluation every other case). An evaluation case that is also trained
on is refused unless allowed, and then the evaluation is labelled ``overlapping``, never
``held-out``. ``summarize`` turns the scores of an evaluation (one list per case) into
:class:`EvalResult` with the report's estimators: the case is the unit (its mean over its
samples), the standard error is over cases, pass@k is the unbiased estimator per case.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rollout.core.envs import Case
from rollout.core.setup import SetupError
from rollout.results.estimates import Spread
from rollout.results.report import pass_at_k

__all__ = [
    "HELD_OUT",
    "OVERLAPPING",
    "CaseSplit",
    "EvalResult",
    "choose_cases",
    "eval_line",
    "run_eval",
    "sampling",
    "summarize",
    "summary_line",
]

HELD_OUT = "held-out"
OVERLAPPING = "overlapping (train-set eval)"
SPLIT_FIELD = "split"


@dataclass(frozen=True)
class CaseSplit:
    """The trained cases, the evaluated cases, the evaluated cases also trained on (empty unless
    allowed) and the evaluation's label: :data:`HELD_OUT` or :data:`OVERLAPPING`."""

    train: list[str]
    eval: list[str]
    overlap: list[str]

    @property
    def label(self) -> str:
        """:data:`OVERLAPPING` when an evaluated case is trained on, else :data:`HELD_OUT`."""
        return OVERLAPPING if self.overlap else HELD_OUT


def _split_of(cases: Sequence[Case], name: str) -> list[str]:
    return [c.case_id for c in cases if c.row.get(SPLIT_FIELD) == name]


def choose_cases(
    env: str,
    cases: Sequence[Case],
    train: Sequence[str] | None,
    evaluate: Sequence[str] | None,
    allow_overlap: bool = False,
) -> CaseSplit:
    """The :class:`CaseSplit` of ``env``'s ``cases`` for ``--cases`` (``train``) and ``--eval-cases``
    (``evaluate``), None for the defaults: the env's ``split: train`` / ``split: eval`` rows when it
    has the field, else every case trained and every case not trained evaluated. SetupError for an
    unknown case id, no case to train or to evaluate on, and an evaluated case that is trained on
    unless ``allow_overlap``."""
    known = [c.case_id for c in cases]
    has_split = any(SPLIT_FIELD in c.row for c in cases)
    unknown = sorted((set(train or []) | set(evaluate or [])) - set(known))
    if unknown:
        raise SetupError(f"--cases/--eval-cases: env {env} has no case {unknown}")
    train_ids = list(dict.fromkeys(train)) if train else _split_of(cases, "train") if has_split else known
    if not train_ids:
        raise SetupError(
            f"env {env} has no case with {SPLIT_FIELD}: train: name the cases to train on (--cases)"
        )
    if evaluate:
        eval_ids = list(dict.fromkeys(evaluate))
    else:
        eval_ids = _split_of(cases, "eval") if has_split else [c for c in known if c not in train_ids]
    if not eval_ids:
        raise SetupError(
            f"env {env}: no case left to evaluate on besides the trained ones ({', '.join(train_ids)}): "
            "name them with --eval-cases (and --allow-eval-overlap to evaluate on trained cases)"
        )
    overlap = [c for c in eval_ids if c in train_ids]
    if overlap and not allow_overlap:
        raise SetupError(
            f"the evaluation cases overlap the trained cases: {', '.join(overlap)}; an evaluation on "
            "them is not held-out. Leave them out of --eval-cases or --cases, or pass "
            "--allow-eval-overlap to evaluate on them anyway (reported as overlapping)"
        )
    return CaseSplit(train=train_ids, eval=eval_ids, overlap=overlap)


@dataclass(frozen=True)
class EvalResult:
    """One evaluation: ``when`` (before, step N, after) at ``step`` (optimizer steps done), its
    ``label``, ``cases`` evaluated with ``samples`` each at ``temperature`` (0: greedy; None: the
    model server's default), the mean reward and pass@1 over cases with their standard errors (None
    under 2 cases), and pass@k for k = ``samples`` (None when 1)."""

    when: str
    step: int
    label: str
    cases: int
    samples: int
    temperature: float | None
    mean_reward: float
    mean_reward_se: float | None
    pass_rate: float
    pass_rate_se: float | None
    pass_at_k: float | None
    pass_at_k_se: float | None

    @property
    def n(self) -> int:
        """Samples graded in all."""
        return self.cases * self.samples


def summarize(
    scores: Mapping[str, Sequence[float]],
    *,
    when: str,
    step: int,
    label: str,
    temperature: float | None,
    pass_score: float,
) -> EvalResult:
    """The :class:`EvalResult` of ``scores`` (case id -> the scores of its samples, the same number
    for every case, at least one case)."""
    counts = {len(v) for v in scores.values()}
    if len(counts) != 1 or 0 in counts:
        raise ValueError(
            f"summarize: every case needs the same number (>= 1) of scores, got {sorted(counts)}"
        )
    (k,) = counts
    reward, pass1, passk = Spread(), Spread(), Spread()
    for values in scores.values():
        passed = sum(float(v) >= pass_score for v in values)
        reward.add(sum(float(v) for v in values) / k)
        pass1.add(pass_at_k(k, passed, 1))
        passk.add(pass_at_k(k, passed, k))
    return EvalResult(
        when=when,
        step=step,
        label=label,
        cases=len(scores),
        samples=k,
        temperature=temperature,
        mean_reward=reward.mean,
        mean_reward_se=reward.stderr,
        pass_rate=pass1.mean,
        pass_rate_se=pass1.stderr,
        pass_at_k=passk.mean if k > 1 else None,
        pass_at_k_se=passk.stderr if k > 1 else None,
    )


def run_eval(
    rollout: Any, case_ids: Sequence[str], tag: str, samples: int, temperature: float | None
) -> dict[str, list[float]]:
    """``samples`` graded scores per case, run by ``rollout`` (a ``JobRollout``) as job ``<prefix>-<tag>``
    at ``temperature`` (None: the job template's); invalid samples are rerun, never counted."""
    got = asyncio.run(rollout.collect(case_ids, samples, tag, temperature=temperature, scores_only=True))
    return {c: [float(s) for s in got.samples[c]] for c in case_ids}


def _pm(value: float, se: float | None) -> str:
    return f"{value:.2f}±{se:.2f}" if se is not None else f"{value:.2f}"


def sampling(result: EvalResult) -> str:
    """``greedy`` or ``T=0.5`` (``T=server default`` when unknown)."""
    if result.temperature == 0:
        return "greedy"
    return "T=server default" if result.temperature is None else f"T={result.temperature:g}"


def eval_line(result: EvalResult) -> str:
    """One printed line: label, pass@1 ± se, pass@k, mean reward ± se, cases x samples and sampling."""
    at_k = (
        f"  pass@{result.samples} {_pm(result.pass_at_k, result.pass_at_k_se)}"
        if result.pass_at_k is not None
        else ""
    )
    return (
        f"eval {result.when:8s} {result.label}  pass@1 {_pm(result.pass_rate, result.pass_rate_se)}{at_k}  "
        f"mean reward {_pm(result.mean_reward, result.mean_reward_se)}  (n={result.cases} cases x "
        f"{result.samples} sample{'s' if result.samples > 1 else ''}, {sampling(result)})"
    )


def summary_line(before: EvalResult, after: EvalResult) -> str:
    """The last line of a run: the label, pass@1 and mean reward before -> after, with their n."""
    return (
        f"{after.label} pass@1 {_pm(before.pass_rate, before.pass_rate_se)} -> "
        f"{_pm(after.pass_rate, after.pass_rate_se)}, mean reward {_pm(before.mean_reward, before.mean_reward_se)}"
        f" -> {_pm(after.mean_reward, after.mean_reward_se)} (n={after.cases} cases x {after.samples} "
        f"sample{'s' if after.samples > 1 else ''}, {sampling(after)})"
    )
