"""Tests for rollout.results.report: pass@k (Chen et al. 2021), the per-(env, model) summary, the text
table and the JSONL export."""

from __future__ import annotations

import itertools
import json
import math
import statistics
from fractions import Fraction
from pathlib import Path

import pytest
from pydantic import ValidationError

from rollout.results.report import (
    AttemptRecord,
    JsonlWriter,
    ReportTotals,
    SessionRecord,
    SummaryRow,
    pass_at_k,
    read_jsonl,
    render_table,
    summarize,
    table_footer,
    write_jsonl,
)
from rollout.results.session_fields import UsageTotals

# ---------------------------------------------------------------------------------------------
# pass@k
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (5, 2, 1, 0.4),  # c / n
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (10, 0, 1, 0.0),
        (10, 0, 5, 0.0),
        (10, 10, 1, 1.0),
        (10, 10, 10, 1.0),
        (4, 1, 4, 1.0),  # n - c < k
        (1, 0, 1, 0.0),
        (1, 1, 1, 1.0),
    ],
)
def test_pass_at_k_hand_values(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_matches_brute_force_enumeration() -> None:
    checked = 0
    for n in range(1, 9):
        for c in range(0, n + 1):
            passing = set(range(c))  # which samples pass does not matter, only how many
            for k in range(1, n + 1):
                draws = list(itertools.combinations(range(n), k))
                hits = sum(1 for draw in draws if passing.intersection(draw))
                expected = Fraction(hits, len(draws))
                assert pass_at_k(n, c, k) == pytest.approx(float(expected), abs=1e-12), (n, c, k)
                checked += 1
    assert checked == sum(n * (n + 1) for n in range(1, 9))


def test_pass_at_k_large_n_is_stable() -> None:
    value = pass_at_k(2000, 3, 100)
    exact = 1 - Fraction(math.comb(1997, 100), math.comb(2000, 100))
    assert value == pytest.approx(float(exact), rel=1e-12)


@pytest.mark.parametrize(
    "n, c, k",
    [(5, 2, 6), (5, 2, 0), (5, 6, 1), (5, -1, 1), (0, 0, 1), (5.0, 2, 1), (5, 2, True), (5, "2", 1)],
)
def test_pass_at_k_rejects_bad_inputs(n: object, c: object, k: object) -> None:
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# summarize
# ---------------------------------------------------------------------------------------------


def rec(
    env: str,
    case: str,
    idx: int,
    score: float | None,
    eval_status: str | None = "scored",
    status: str = "succeeded",
    duration: float | None = 1.0,
    model: str = "m1",
) -> SessionRecord:
    return SessionRecord(
        session_id=f"{env}-{model}-{case}-{idx}",
        job_id="job-1",
        env_name=env,
        case_id=case,
        group_id=f"{env}-{case}",
        model=model,
        sample_index=idx,
        status=status,  # type: ignore[arg-type]
        score=score,
        eval_status=eval_status,
        duration_s=duration,
    )


def crafted() -> list[SessionRecord]:
    return [
        # math / m1, case A: 10, 10, 0 (all scored)
        rec("math", "A", 0, 10.0, duration=1.0),
        rec("math", "A", 1, 10.0, duration=2.0),
        rec("math", "A", 2, 0.0, duration=3.0),
        # case B: 10 scored, an invalid reward (committed 0), an evaluator error on a failed runtime
        rec("math", "B", 0, 10.0, duration=4.0),
        rec("math", "B", 1, 0.0, "invalid_reward", duration=5.0),
        rec("math", "B", 2, 0.0, "error", status="failed", duration=6.0),
        # case C: an evaluator timeout, 5 scored, a runtime timeout never evaluated
        rec("math", "C", 0, 0.0, "timeout", duration=7.0),
        rec("math", "C", 1, 5.0, duration=8.0),
        rec("math", "C", 2, None, None, status="timeout", duration=None),
        # code / m1: 2 cases x 2 samples
        rec("code", "X", 0, 10.0),
        rec("code", "X", 1, 10.0),
        rec("code", "Y", 0, 10.0 - 1e-10),  # passes (within 1e-9)
        rec("code", "Y", 1, 9.5, status="truncated"),  # used its whole step budget
        # math / m2: one session
        rec("math", "A", 0, 10.0, model="m2", status="error", eval_status="skipped", duration=2.5),
    ]


def by_key(rows: list[SummaryRow]) -> dict[tuple[str, str], SummaryRow]:
    return {(r.env_name, r.model): r for r in rows}


def test_summarize_exact_numbers() -> None:
    rows = summarize(crafted())
    assert [(r.env_name, r.model) for r in rows] == [("code", "m1"), ("math", "m1"), ("math", "m2")]
    rows_by = by_key(rows)

    math_row = rows_by[("math", "m1")]
    assert (math_row.sessions, math_row.cases) == (9, 3)
    assert (math_row.scored, math_row.invalid, math_row.eval_error, math_row.eval_timeout) == (5, 1, 1, 1)
    assert math_row.unevaluated == 1
    # grading failures (invalid, error, timeout) count as their committed 0; the session never evaluated does not
    assert math_row.mean_score == pytest.approx((10 + 10 + 0 + 10 + 0 + 0 + 0 + 5) / 8)
    assert math_row.k == 3  # the group size
    # passes per case: A c=2, B c=1, C c=0, n=3 each
    assert math_row.pass_at_1 == pytest.approx((2 / 3 + 1 / 3 + 0) / 3)
    assert math_row.pass_at_k == pytest.approx((1 + 1 + 0) / 3)
    assert math_row.pass_at_k_cases == 3
    # standard errors clustered by case: each case's mean (A 20/3, B 10/3, C (0 + 5) / 2; the
    # unevaluated session is not counted), then sd(means) / sqrt(3)
    case_means = [20 / 3, 10 / 3, 5 / 2]
    assert math_row.score_stderr == pytest.approx(statistics.stdev(case_means) / math.sqrt(3))
    assert math_row.score_stderr == pytest.approx(1.2729376, abs=1e-7)
    assert math_row.pass_at_1_stderr == pytest.approx(statistics.stdev([2 / 3, 1 / 3, 0]) / math.sqrt(3))
    assert math_row.pass_at_1_stderr == pytest.approx(1 / 3 / math.sqrt(3))
    assert (math_row.runtime_failed, math_row.runtime_errors, math_row.runtime_timeouts) == (1, 0, 1)
    assert math_row.mean_duration_s == pytest.approx(36 / 8)

    code_row = rows_by[("code", "m1")]
    assert (code_row.sessions, code_row.cases, code_row.scored, code_row.k) == (4, 2, 4, 2)
    assert (code_row.runtime_failed, code_row.runtime_truncated, math_row.runtime_truncated) == (0, 1, 0)
    assert code_row.pass_at_1 == pytest.approx((1.0 + 0.5) / 2)
    assert code_row.pass_at_k == pytest.approx(1.0)
    assert code_row.mean_score == pytest.approx((10 + 10 + (10 - 1e-10) + 9.5) / 4)
    assert code_row.score_stderr == pytest.approx(
        statistics.stdev([10, (20 - 1e-10 - 0.5) / 2]) / math.sqrt(2)
    )
    assert code_row.pass_at_1_stderr == pytest.approx(0.25)  # sd(1, 0.5) / sqrt(2)
    assert (code_row.runtime_errors, code_row.runtime_timeouts, code_row.invalid) == (0, 0, 0)

    m2 = rows_by[("math", "m2")]
    # eval_status "skipped": not scored, so no mean and no pass even with a 10 recorded
    assert (m2.sessions, m2.scored, m2.unevaluated, m2.mean_score, m2.k) == (1, 0, 1, None, 1)
    # nothing of m2 was evaluated: no pass rate at all (not a 0 that looks measured)
    assert (m2.pass_at_1, m2.pass_at_k, m2.runtime_errors, m2.mean_duration_s) == (None, None, 1, 2.5)
    assert (m2.score_stderr, m2.pass_at_1_stderr) == (None, None)


def test_stderr_needs_two_cases_and_leaves_out_what_is_not_counted() -> None:
    one_case = summarize([rec("e", "A", i, s) for i, s in enumerate((10.0, 0.0, 5.0))])
    assert (one_case[0].mean_score, one_case[0].score_stderr, one_case[0].pass_at_1_stderr) == (
        5.0,
        None,
        None,
    )
    records = [
        rec("e", "A", 0, 10.0),
        rec("e", "A", 1, 0.0),
        rec("e", "B", 0, 4.0),
        rec("e", "B", 1, None, "grader_broken"),  # B's mean is 4: broken left out
        rec("e", "C", 0, 0.0, "invalid_reward"),
    ]  # C's mean is the agent's 0
    (row,) = summarize(records)
    assert row.score_stderr == pytest.approx(math.sqrt(((5 - 3) ** 2 + (4 - 3) ** 2 + (0 - 3) ** 2) / 2 / 3))
    assert row.pass_at_1_stderr == pytest.approx(statistics.stdev([0.5, 0.0, 0.0]) / math.sqrt(3))
    assert render_table([row]).splitlines()[2].split()[4:6] == ["3.50±1.53", "0.167±0.167"]


def test_summarize_explicit_k() -> None:
    rows = by_key(summarize(crafted(), k=2))
    math_row = rows[("math", "m1")]
    assert math_row.k == 2
    # A: 1 - C(1,2)/C(3,2) = 1; B: 1 - C(2,2)/C(3,2) = 2/3; C: 0
    assert math_row.pass_at_k == pytest.approx((1 + 2 / 3 + 0) / 3)
    assert math_row.mean_score == pytest.approx(35 / 8)  # unchanged by k
    assert math_row.pass_at_1 == pytest.approx(1 / 3)  # unchanged by k

    # k larger than some groups: those cases are left out of pass@k
    rows = by_key(summarize(crafted(), k=3))
    assert rows[("code", "m1")].pass_at_k is None
    assert rows[("code", "m1")].pass_at_k_cases == 0
    assert rows[("math", "m1")].pass_at_k_cases == 3


def test_summarize_uneven_groups_default_k_is_smallest_group() -> None:
    records = [rec("e", "A", i, 10.0 if i == 0 else 0.0) for i in range(4)] + [
        rec("e", "B", i, 0.0) for i in range(2)
    ]
    (row,) = summarize(records)
    assert row.k == 2
    assert row.pass_at_k == pytest.approx((pass_at_k(4, 1, 2) + 0.0) / 2)  # (0.5 + 0) / 2


def test_summarize_empty_and_bad_k() -> None:
    assert summarize([]) == []
    with pytest.raises(ValueError):
        summarize(crafted(), k=0)


# ---------------------------------------------------------------------------------------------
# render_table
# ---------------------------------------------------------------------------------------------


def test_render_table() -> None:
    lines = render_table(summarize(crafted())).splitlines()
    header = lines[0]
    assert header.split() == [
        "env",
        "model",
        "sess",
        "scored",
        "score",
        "pass@1",
        "pass@k",
        "k",
        "failed",
        "time_s",
    ]
    assert set(lines[1]) == {"-", " "}
    math_i = next(i for i, line in enumerate(lines) if line.startswith("math") and " m1 " in line)
    math_line = lines[math_i]
    # score and pass@1 carry their standard error over cases (each case's mean: 20/3, 10/3, 5/2; passing 2/3, 1/3, 0)
    assert math_line.split() == ["math", "m1", "9", "5", "4.38±1.27", "0.333±0.192", "0.667", "3", "1", "4.5"]
    # the rarely non-zero counts are folded into a line under the row, only the non-zero ones
    assert lines[math_i + 1] == "  problems: inval 1, ev_err 1, ev_t/o 1, rt_t/o 1"
    code_i = next(i for i, line in enumerate(lines) if line.startswith("code"))
    assert lines[code_i].split()[8] == "0"  # none failed
    assert lines[code_i + 1] == "  problems: trunc 1"  # one used its whole step budget
    m2_i = next(i for i, line in enumerate(lines) if " m2 " in line)
    assert lines[m2_i].split()[4] == "-"  # no mean score
    assert lines[m2_i + 1] == "  problems: rt_err 1"
    # right-aligned numeric columns end at the same offset as their header
    end = header.index("pass@1") + len("pass@1")
    assert math_line[end - 11 : end] == "0.333±0.192"
    # the legend explains the abbreviations, the problem ones only when shown
    legend = " ".join(" ".join(lines[m2_i + 2 :]).split())  # the wrapped lines as one
    assert legend.startswith(
        "score: mean of graded sessions (0-10; a grading failure the agent caused counts 0)"
    )
    assert "±: standard error over cases (each case's mean)" in legend
    assert "rt_err = runtime error" in legend and "ev_t/o = evaluator timeout" in legend
    assert "infra =" not in legend and "retried =" not in legend and "cut name" not in legend
    assert render_table([]) == "(no sessions)"


def _row(env: str, model: str, **counts: float | int | None) -> SummaryRow:
    values: dict[str, object] = dict(
        env_name=env,
        model=model,
        sessions=0,
        cases=0,
        scored=0,
        invalid=0,
        eval_error=0,
        eval_timeout=0,
        unevaluated=0,
        mean_score=None,
        k=1,
        pass_at_1=None,
        pass_at_k=None,
        pass_at_k_cases=0,
        runtime_failed=0,
        runtime_errors=0,
        runtime_timeouts=0,
        mean_duration_s=None,
    )
    values.update(counts)
    return SummaryRow.model_validate(values)


def test_render_table_fits_100_columns_with_long_names() -> None:
    rows = [
        _row(
            "gsm8k-platinum-reasoning",
            "Qwen/Qwen2.5-7B-Instruct-1M",
            sessions=12000,
            cases=1500,
            scored=11880,
            eval_error=20,
            eval_timeout=100,
            mean_score=6.41,
            k=8,
            pass_at_1=0.641,
            pass_at_k=0.912,
            pass_at_k_cases=1500,
            runtime_failed=2,
            mean_duration_s=14.2,
            retried=30,
            score_stderr=0.1234,
            pass_at_1_stderr=0.0116,
        ),
        _row(
            "workspace-shell-tasks-long",
            "Qwen/Qwen2.5-7B-Instruct-1M",
            sessions=400,
            cases=50,
            scored=396,
            invalid=1,
            runtime_failed=120,
            runtime_errors=2,
            runtime_timeouts=4,
            infra=1,
            k=8,
            mean_score=3.2,
            pass_at_1=0.3,
            pass_at_k=0.6,
            pass_at_k_cases=50,
            mean_duration_s=1095.0,
        ),
    ]
    text = render_table(rows)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 100
    assert max(len(line) for line in lines) >= 95  # the names got the room there is, no more cut
    # the longer names are cut in the middle: start and end kept, full names in the legend
    env1, model1 = lines[2].split()[:2]
    assert env1.startswith("gsm8k-") and env1.endswith("asoning") and ".." in env1
    assert model1.startswith("Qwen/Qw") and model1.endswith("-1M") and ".." in model1
    assert f"cut name: {env1} = gsm8k-platinum-reasoning" in lines
    assert f"cut name: {model1} = Qwen/Qwen2.5-7B-Instruct-1M" in lines
    assert lines[2].split()[2:] == ["12000", "11880", "6.41±0.12", "0.641±0.012", "0.912", "8", "2", "14.2"]
    assert lines[3] == "  problems: ev_err 20, ev_t/o 100, retried 30"
    assert lines[5] == "  problems: inval 1, rt_err 2, rt_t/o 4, infra 1"
    legend = " ".join(line.strip() for line in lines[6:])
    for abbreviation in ("inval =", "ev_err =", "ev_t/o =", "rt_err =", "rt_t/o =", "retried =", "infra ="):
        assert abbreviation in legend
    # short names are never cut; a narrower width is honoured too
    assert "cut name" not in render_table([_row("gsm8k", "local", sessions=6)])
    assert max(len(line) for line in render_table(rows, width=90).splitlines()) <= 90
    # two names that cut alike are both named under the table
    alike = render_table(
        [_row("swe-bench-lite-python-split-a", "m"), _row("swe-bench-full-python-split-a", "m")], width=75
    ).splitlines()
    assert max(len(line) for line in alike) <= 75
    assert alike[2].split()[0] == alike[3].split()[0] == "swe-b..lit-a"
    assert " ".join(alike).endswith(
        "cut name: swe-b..lit-a = swe-bench-lite-python-split-a or   swe-bench-full-python-split-a"
    )


# ---------------------------------------------------------------------------------------------
# write_jsonl
# ---------------------------------------------------------------------------------------------


def test_write_jsonl_roundtrip(tmp_path: Path) -> None:
    records = crafted()
    records[0] = records[0].model_copy(
        update={
            "usage": UsageTotals(prompt_tokens=10, completion_tokens=5, total_tokens=15),
            "step_count": 1,
            "trajectory": [{"seq": 0, "content": "héllo", "usage": {"total_tokens": 15}}],
            "reason": None,
        }
    )
    out = tmp_path / "deep" / "dir" / "out.jsonl"
    assert write_jsonl(out, iter(records)) == len(records)
    lines = out.read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(records)
    back = [SessionRecord.model_validate_json(line) for line in lines]
    assert back == records
    assert json.loads(lines[0])["usage"] == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    assert [p.name for p in out.parent.iterdir()] == ["out.jsonl"]  # no temp file left


def test_write_jsonl_rejects_nan_and_leaves_target_untouched(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_text("previous\n", encoding="utf-8")
    bad_traj = rec("e", "A", 0, 1.0).model_copy(update={"trajectory": [{"logprob": float("nan")}]})
    with pytest.raises(ValueError):
        write_jsonl(out, [rec("e", "A", 1, 2.0), bad_traj])
    # a NaN score slipped past validation (model_construct) is refused as well
    bad_score = SessionRecord.model_construct(**{**rec("e", "A", 2, 3.0).model_dump(), "score": float("nan")})
    with pytest.raises(ValueError):
        write_jsonl(out, [bad_score])
    assert out.read_text(encoding="utf-8") == "previous\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]


def test_session_record_rejects_non_finite_scores() -> None:
    for bad in (float("nan"), float("inf"), float("-inf")):
        with pytest.raises(ValidationError):
            rec("e", "A", 0, bad)
    with pytest.raises(ValidationError):
        rec("e", "A", 0, 1.0, status="done")


# ---------------------------------------------------------------------------------------------
# ReportTotals: the report's numbers counted record by record (the launcher streams them)
# ---------------------------------------------------------------------------------------------


def _infra(r: SessionRecord) -> SessionRecord:
    return r.model_copy(
        update={
            "status": "error",
            "outcome": "gateway_unreachable",
            "score": None,
            "eval_status": "infra_error",
            "sandbox": "none",
            "attempts": [
                AttemptRecord(
                    attempt=1,
                    status="error",
                    outcome="gateway_unreachable",
                    infra=True,
                    steps_session_id=f"{r.session_id}~a1",
                ),
                AttemptRecord(
                    attempt=2,
                    status="error",
                    outcome="gateway_unreachable",
                    infra=True,
                    steps_session_id=r.session_id,
                ),
            ],
            "retried": True,
        }
    )


def test_totals_streamed_in_case_order_equal_summarize() -> None:
    records = sorted(
        crafted()
        + [
            _infra(rec("math", "D", 0, 0.0)),
            rec("math", "D", 1, 10.0),
            rec("code", "Z", 0, 7.3, duration=0.1),
            rec("code", "Z", 1, 2.9, duration=0.2),
        ],
        key=lambda r: (r.env_name, r.case_id, r.sample_index),
    )
    totals, case = ReportTotals(), None
    for r in records:
        if (r.env_name, r.case_id) != case:  # as the launcher does: a finished case keeps only its counts
            totals.fold_cases()
            case = (r.env_name, r.case_id)
        totals.add(r)
        assert all(len(row.open_ids) <= 1 for row in totals._rows.values())  # one case open per row
    for k in (None, 2, 3):
        assert totals.summary(k=k) == summarize(records, k=k)
    [code, math_m1, _] = totals.summary()
    assert math_m1.cases == 4 and math_m1.infra == 1 and math_m1.retried == 1
    assert math_m1.pass_at_1 == pytest.approx((2 / 3 + 1 / 3 + 0 + 1) / 4)  # D: its one graded sample passes
    # exact sums: the mean is math.fsum(values) / len(values), as for a list
    assert code.mean_score == math.fsum([10.0, 10.0, 10.0 - 1e-10, 9.5, 7.3, 2.9]) / 6
    durations = [r.duration_s for r in records if r.env_name == "code" and r.duration_s is not None]
    assert code.mean_duration_s == math.fsum(durations) / len(durations) and len(durations) == 6
    assert (totals.sessions, totals.infra_attempts, totals.lost) == (len(records), 2, 1)
    assert totals.footer() == table_footer(records) is not None and "math (1)" in str(totals.footer())
    assert totals.count(statuses={"error", "timeout"}) == sum(
        r.status in ("error", "timeout") for r in records
    )
    assert totals.count(eval_statuses={"error"}) == 1 and totals.count() == 0


def test_totals_of_records_in_any_order_equal_summarize() -> None:
    records = crafted()
    shuffled = records[::2] + records[1::2]
    assert ReportTotals.of(shuffled).summary() == summarize(records)
    with pytest.raises(ValueError):
        ReportTotals.of(records).summary(k=0)


def test_jsonl_writer_streams_and_reads_back(tmp_path: Path) -> None:
    out = tmp_path / "o.jsonl"
    with JsonlWriter(out) as w:
        for r in crafted():
            w.write(r)
        assert not out.exists()  # moved in place only when the block ends
    assert w.count == len(crafted()) and read_jsonl(out) == crafted()
    with pytest.raises(RuntimeError), JsonlWriter(out) as w:
        w.write(rec("e", "A", 0, 1.0))
        raise RuntimeError("stopped")
    assert read_jsonl(out) == crafted()  # untouched
    assert [p.name for p in tmp_path.iterdir()] == ["o.jsonl"]


def test_reward_is_the_score_on_0_to_1_beside_it(tmp_path: Path) -> None:
    assert [rec("e", "c", 0, s).reward for s in (10.0, 7.0, 0.0, None)] == [1.0, 0.7, 0.0, None]
    given = rec("e", "c", 0, 4.0).model_dump()
    assert list(given)[list(given).index("score") + 1] == "reward"  # next to the score in each JSON line
    # derived, never taken as given: a line claiming another reward, or an older line without one
    assert SessionRecord.model_validate({**given, "reward": 1.0}).reward == 0.4
    old = {k: v for k, v in given.items() if k != "reward"}
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(old) + "\n")
    assert [r.reward for r in read_jsonl(path)] == [0.4]
