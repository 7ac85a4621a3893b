"""Tests for rollout.results.progress: what the launcher's progress display counts and prints, from
records built here and an elapsed time passed in (no clock)."""

from __future__ import annotations

import io

import pytest

from rollout.results.progress import ProgressState, record_problems
from rollout.results.report import AttemptRecord, SessionRecord


def rec(
    env: str,
    idx: int,
    score: float | None,
    eval_status: str | None = "scored",
    status: str = "succeeded",
    outcome: str | None = None,
    retried: bool = False,
) -> SessionRecord:
    return SessionRecord(
        session_id=f"{env}-{idx}",
        job_id="j",
        env_name=env,
        case_id=f"c{idx}",
        group_id=f"g{idx}",
        model="m",
        sample_index=0,
        status=status,  # type: ignore[arg-type]
        score=score,
        eval_status=eval_status,
        outcome=outcome,
        retried=retried,
        attempts=[
            AttemptRecord(
                attempt=1, status=status, outcome=outcome or status, steps_session_id=f"{env}-{idx}"
            )
        ],
    )


def test_counts_per_env_running_mean_and_problems() -> None:
    state = ProgressState(totals={"gsm8k": 6, "workspace": 5})
    assert state.describe(0.0) == (
        "gsm8k 0/6 mean - | workspace 0/5 mean - | mean - | problems none | - sessions/min"
    )
    for r in [
        rec("gsm8k", 0, 10.0),
        rec("gsm8k", 1, 5.0, retried=True),
        rec("gsm8k", 2, 0.0, eval_status="error"),  # an evaluator error the agent caused: its 0 counts
        rec("workspace", 0, 4.0, status="failed"),  # failed is a normal result, not a problem
        rec("workspace", 1, None, eval_status=None, status="timeout"),
        rec("workspace", 2, None, eval_status=None, status="error", outcome="gateway_unreachable"),
    ]:
        state.update(r)
    assert (state.n_done, state.n_total) == (6, 11)
    assert state.mean_score("gsm8k") == pytest.approx(5.0)
    assert state.mean_score("workspace") == pytest.approx(4.0)
    assert state.mean_score() == pytest.approx((10 + 5 + 0 + 4) / 4)
    assert state.describe(120.0) == (
        "gsm8k 3/6 mean 5.00 | workspace 3/5 mean 4.00 | mean 4.75 | "
        "problems ev_err 1, rt_t/o 1, retried 1, infra 1 | 3.0 sessions/min"  # the outage: infra only
    )


def test_record_problems_and_an_env_that_was_not_planned() -> None:
    assert record_problems(rec("a", 0, 3.0)) == []
    assert record_problems(rec("a", 0, None, eval_status="timeout", retried=True)) == ["ev_t/o", "retried"]
    # the same problems as the summary table's: a truncated session, an invalid reward
    assert record_problems(rec("a", 0, 0.0, status="truncated")) == ["trunc"]
    assert record_problems(rec("a", 0, None, eval_status="invalid_reward")) == ["inval"]
    state = ProgressState(totals={"a": 1})
    state.update(rec("b", 0, 2.0))
    assert (
        state.describe(30.0)
        == "a 0/1 mean - | b 1/1 mean 2.00 | mean 2.00 | problems none | 2.0 sessions/min"
    )


def test_the_display_fits_the_width_and_drops_parts_before_it_cuts() -> None:
    from rollout.results.progress import render_progress

    state = ProgressState(totals={"basics": 12, "gsm8k": 6, "workspace": 5})
    for r in [
        rec("basics", 0, 10.0),
        rec("basics", 1, 2.0),
        rec("gsm8k", 0, None, eval_status=None, status="timeout"),
    ]:
        state.update(r)
    assert render_progress(state, 90.0, 200) == [
        "3/23 sessions [#...........] | 1:30 elapsed, 10:00 left | mean 6.00 | problems rt_t/o 1 | 2.0/min",
        "  basics 2/12 mean 6.00 | gsm8k 1/6 | workspace 0/5",
    ]
    assert render_progress(state, 90.0, 80) == [  # the rate and the bar go first
        "3/23 sessions | 1:30 elapsed, 10:00 left | mean 6.00 | problems rt_t/o 1",
        "  basics 2/12 mean 6.00 | gsm8k 1/6 | workspace 0/5",
    ]
    for width in (120, 100, 80, 60, 40, 20, 5, 1):
        lines = render_progress(state, 3725.0, width)
        assert len(lines) == 2 and all(len(line) < max(width, 2) for line in lines), (width, lines)
    assert render_progress(state, 3725.0, 40)[0] == "3/23 sessions | 1:02:05 elapsed, 6:5..."
    single = ProgressState(totals={"a": 4})
    assert render_progress(single, 0.0, 100) == [
        "0/4 sessions [............] | 0:00 elapsed, ? left | mean -"
    ]


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_first_frame_has_its_own_line_and_the_clock_ticks_between_completions() -> None:
    from rollout.cli.run import Progress

    now = [100.0]
    term = FakeTerminal("job line\n")
    term.seek(0, io.SEEK_END)
    display = Progress(
        True, term, clock=lambda: now[0], width=lambda: 100, tick_s=None
    )  # no thread: ticks by hand
    display.plan({"a": 2, "b": 2})
    display.start("j", 4)
    first = term.getvalue()
    assert first == "job line\n0/4 sessions [............] | 0:00 elapsed, ? left | mean -\n  a 0/2 | b 0/2"
    now[0] += 65  # no session finished: the clock still moves
    display.tick()
    assert term.getvalue()[len(first) :] == (
        "\r\x1b[1F\x1b[J0/4 sessions [............] | 1:05 elapsed, ? left | mean -\n  a 0/2 | b 0/2"
    )
    display.done(rec("a", 0, 10.0))
    assert term.getvalue().endswith(
        "1/4 sessions [###.........] | 1:05 elapsed, 3:15 left | mean 10.00 | "
        "0.9/min\n  a 1/2 mean 10.00 | b 0/2"
    )
    display.close()
    assert term.getvalue().endswith("b 0/2\n") and display.drawn == 0
    closed = term.getvalue()
    display.tick()  # a tick racing the close draws nothing
    assert term.getvalue() == closed


def test_the_clock_thread_stops_with_the_display() -> None:
    from rollout.cli.run import Progress

    display = Progress(True, FakeTerminal(), clock=lambda: 0.0, width=lambda: 80, tick_s=3600)
    display.start("j", 1)
    assert display._ticker is not None and display._ticker.is_alive()
    display.close()  # wakes the thread's wait: no need for the hour to pass
    assert not display._ticker.is_alive()


def test_a_log_line_clears_the_frame_and_the_next_frame_is_drawn_below_it() -> None:
    import logging

    from rollout.cli.run import Progress
    from rollout.core.logs import notices

    term = FakeTerminal()
    handler = logging.StreamHandler(term)
    handler.setFormatter(logging.Formatter("%(message)s"))
    notices.addHandler(handler)
    try:
        display = Progress(True, term, clock=lambda: 0.0, width=lambda: 80, tick_s=None)
        display.plan({"a": 1, "b": 1})
        display.start("j", 2)
        frame = "0/2 sessions [............] | 0:00 elapsed, ? left | mean -\n  a 0/1 | b 0/1"
        assert term.getvalue() == frame
        notices.warning("warning: something happened")
        display.tick()
        assert term.getvalue() == frame + "\r\x1b[1F\x1b[J" + "warning: something happened\n" + frame
        display.close()
        assert display._before_log not in handler.filters  # a log line after the job is left alone
    finally:
        notices.removeHandler(handler)
