"""The viewer shows a latency as read, not as a count of milliseconds."""

from __future__ import annotations

from rollout.servers.viewer.render import fmt_ms, templates

CASES = [
    (None, "-"),
    (float("nan"), "-"),
    (0, "0 ms"),
    (734.4, "734 ms"),
    (12_345, "12.3 s"),
    (59_949, "59.9 s"),
    (184_763, "3 min 5 s"),
    (3_600_000, "60 min 0 s"),
]


def test_a_latency_reads_in_the_unit_that_fits() -> None:
    assert [fmt_ms(ms) for ms, _ in CASES] == [shown for _, shown in CASES]


def test_the_step_line_uses_it() -> None:
    assert templates().from_string("{{ v|ms }}").render(v=184763) == "3 min 5 s"
