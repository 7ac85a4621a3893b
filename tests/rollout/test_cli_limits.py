"""Flag values the launcher's commands refuse with one line before doing anything (argparse's
``error: argument --flag: ...``, exit 2): ports outside 0..65535, ``min_valid`` below 1, float
flags that are not finite or out of range; and the converters themselves."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rollout.cli import feed as feed_cli
from rollout.cli import viewer as viewer_cli
from rollout.core.argtypes import finite_float, int_at_least, port_number

REPO = Path(__file__).resolve().parents[2]


def test_converters_accept_the_range_and_refuse_the_rest() -> None:
    assert [port_number(v) for v in ("0", "8765", "65535")] == [0, 8765, 65535]
    for bad, msg in (
        ("65536", "65536 is not a port number (0..65535; 0: any free port)"),
        ("-1", "-1 is not a port number (0..65535; 0: any free port)"),
        ("http", "'http' is not a port number (0..65535)"),
    ):
        with pytest.raises(argparse.ArgumentTypeError) as ei:
            port_number(bad)
        assert str(ei.value) == msg
    assert int_at_least(1)("3") == 3
    with pytest.raises(argparse.ArgumentTypeError, match=r"^0 is below 1 \(it must be at least 1\)$"):
        int_at_least(1)("0")
    assert finite_float()("-2.5") == -2.5 and finite_float(low=0)("0") == 0.0
    for conv, bad, msg in (
        (finite_float(), "nan", "'nan' is not a finite number"),
        (finite_float(), "-inf", "'-inf' is not a finite number"),
        (finite_float(), "x", "'x' is not a number"),
        (finite_float(low=0), "-1", "-1 is below 0"),
        (finite_float(positive=True), "0", "0 must be above 0"),
    ):
        with pytest.raises(argparse.ArgumentTypeError) as ei:
            conv(bad)
        assert str(ei.value) == msg, bad


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["export", "--job-id", "j", "--min-valid-samples", "0"],
            "argument --min-valid-samples: 0 is below 1 (it must be at least 1)",
        ),
        (
            ["export", "--job-id", "j", "--min-valid-samples", "-3"],
            "argument --min-valid-samples: -3 is below 1 (it must be at least 1)",
        ),
        (
            ["export", "--job-id", "j", "--min-score", "nan"],
            "argument --min-score: 'nan' is not a finite number",
        ),
        (
            ["export", "--job-id", "j", "--min-score", "inf"],
            "argument --min-score: 'inf' is not a finite number",
        ),
        (
            ["feed", "--min-valid-samples", "-2"],
            "argument --min-valid-samples: -2 is below 1 (it must be at least 1)",
        ),
        (
            ["feed", "--port", "99999"],
            "argument --port: 99999 is not a port number (0..65535; 0: any free port)",
        ),
        (["feed", "--poll-interval-s", "nan"], "argument --poll-interval-s: 'nan' is not a finite number"),
        (["feed", "--poll-interval-s", "0"], "argument --poll-interval-s: 0 must be above 0"),
        (
            ["serve", "--port", "70000"],
            "argument --port: 70000 is not a port number (0..65535; 0: any free port)",
        ),
        (
            ["serve", "--min-valid-samples", "0"],
            "argument --min-valid-samples: 0 is below 1 (it must be at least 1)",
        ),
        (["serve", "--eval-timeout", "inf"], "argument --eval-timeout: 'inf' is not a finite number"),
        (["serve", "--retry-backoff-s", "nan"], "argument --retry-backoff-s: 'nan' is not a finite number"),
        (["serve", "--pool-size", "0"], "argument --pool-size: 0 is below 1 (it must be at least 1)"),
    ],
)
def test_feed_export_and_serve_refuse_bad_numbers(
    argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as ei:
        feed_cli.main(argv)
    assert ei.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"launcher.py {argv[0]}: error: {line}"


def test_view_refuses_a_port_out_of_range(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ei:
        viewer_cli.main(["view", "--port", "99999"])
    assert ei.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "launcher.py view: error: argument --port: 99999 is not a port number (0..65535; 0: any free port)"
    )


def test_launcher_view_port_as_a_process(tmp_path: Path) -> None:
    """Through ``launcher.py`` itself: one line, no traceback, nothing created."""
    r = subprocess.run(
        [sys.executable, str(REPO / "launcher.py"), "view", "--port", "99999"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.splitlines()[-1].endswith(
        "error: argument --port: 99999 is not a port number (0..65535; 0: any free port)"
    )
    assert list(tmp_path.iterdir()) == []
