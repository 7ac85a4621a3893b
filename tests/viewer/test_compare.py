"""Two jobs on overlapping case sets compared on the cases both scored: the paired difference,
its standard error and interval, and the cases each job has alone (the estimators, the viewer's
/compare page and /api/compare on a real SQLite store)."""

from __future__ import annotations

import html
import math
import re
import statistics
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollout.results.estimates import Spread, paired, stderr, t975
from rollout.servers.viewer.app import create_app
from rollout.servers.viewer.db import open_queries
from rollout.servers.viewer.stats import HiddenFields, compare_paired
from store import JobEnvironment, Store

# (job, env, case, sample, reward, eval_status)
SESSIONS = [
    ("A", "basics", "c1", 0, 10.0, "scored"),
    ("A", "basics", "c1", 1, 5.0, "scored"),  # 7.5
    ("A", "basics", "c2", 0, 0.0, "invalid_reward"),  # the agent's 0
    ("A", "basics", "c2", 1, None, "grader_broken"),  # left out: c2 is 0
    ("A", "basics", "c3", 0, 10.0, "scored"),  # B has no score for c3: A's alone
    ("A", "other", "o1", 0, 4.0, "scored"),
    ("B", "basics", "c1", 0, 5.0, "scored"),
    ("B", "basics", "c2", 0, 10.0, "scored"),
    ("B", "basics", "c3", 0, None, "grader_broken"),
    ("B", "basics", "c5", 0, 10.0, "scored"),  # B's alone
    ("B", "other", "o1", 0, 6.0, "scored"),
]

# common cases: basics c1 7.5 -> 5, c2 0 -> 10; other o1 4 -> 6
BASICS_SE = statistics.stdev([-2.5, 10.0]) / math.sqrt(2)  # 6.25
ALL_SE = statistics.stdev([-2.5, 10.0, 2.0]) / math.sqrt(3)


def test_estimators_by_hand() -> None:
    assert stderr([1.0]) is None and stderr([]) is None
    assert stderr([1.0, 3.0]) == pytest.approx(1.0)  # sd sqrt(2) / sqrt(2)
    spread = Spread()
    spread.add(0.5, 2)
    spread.add(0.0)
    assert (spread.n, spread.mean) == (3, pytest.approx(1 / 3))
    assert spread.stderr == pytest.approx(statistics.stdev([0.5, 0.5, 0.0]) / math.sqrt(3))
    assert t975(1) == pytest.approx(12.7062047) and t975(30) == pytest.approx(2.0422725)
    assert t975(31) == pytest.approx(2.0395134, abs=1e-5) and t975(120) == pytest.approx(1.9799304, abs=1e-5)
    with pytest.raises(ValueError):
        t975(0)
    p = paired({"x": 7.5, "y": 0.0, "z": 10.0}, {"x": 5.0, "y": 10.0, "w": 10.0})
    assert (p.common, p.only_a, p.only_b, p.mean_a, p.mean_b, p.diff) == (2, 1, 1, 3.75, 7.5, 3.75)
    assert p.stderr == pytest.approx(6.25)
    assert p.ci95 == pytest.approx((3.75 - 12.7062047 * 6.25, 3.75 + 12.7062047 * 6.25))
    same = paired({"x": 0.0, "y": 5.0}, {"x": 10.0, "y": 15.0})  # two cases, both +10
    assert (same.common, same.diff, same.stderr, same.ci95) == (2, 10.0, 0.0, None)
    one = paired({"x": 4.0}, {"x": 6.0})
    assert (one.common, one.diff, one.stderr, one.ci95) == (1, 2.0, None, None)
    none = paired({"x": 4.0}, {"y": 6.0})
    assert (none.common, none.only_a, none.only_b, none.mean_a, none.diff) == (0, 1, 1, None, None)


def _counts(job: str) -> list[dict[str, Any]]:
    """``case_outcomes`` rows of ``SESSIONS`` (only what compare_paired reads)."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for j, env, case, _, reward, ev in SESSIONS:
        if j != job:
            continue
        row = rows.setdefault(
            (env, case),
            {
                "env_name": env,
                "llm_model": "m",
                "case_id": case,
                "n": 0,
                "passes": 0,
                "counted": 0,
                "score_sum": 0.0,
            },
        )
        row["n"] += 1
        row["passes"] += reward == 10.0 and ev == "scored"
        if ev != "grader_broken":
            row["counted"] += 1
            row["score_sum"] += reward
    return list(rows.values())


def test_compare_paired_on_common_cases_only() -> None:
    rows, every = compare_paired(_counts("A"), _counts("B"))
    assert [r.env_name for r in rows] == ["basics", "other"]
    basics, other = (r.score for r in rows)
    assert (basics.common, basics.only_a, basics.only_b) == (2, 1, 1)
    assert (basics.mean_a, basics.mean_b, basics.diff) == (3.75, 7.5, 3.75)
    assert basics.stderr == pytest.approx(BASICS_SE) and BASICS_SE == pytest.approx(6.25)
    assert (other.common, other.only_a, other.only_b, other.diff, other.stderr) == (1, 0, 0, 2.0, None)
    s = every.score
    assert (every.env_name, s.common, s.only_a, s.only_b) == (None, 3, 1, 1)
    assert (s.mean_a, s.mean_b) == (pytest.approx(11.5 / 3), pytest.approx(7.0))
    assert s.diff == pytest.approx(7.0 - 11.5 / 3)
    assert s.stderr == pytest.approx(ALL_SE) and ALL_SE == pytest.approx(3.6552854, abs=1e-6)
    assert s.ci95 == pytest.approx((s.diff - 4.3026527 * ALL_SE, s.diff + 4.3026527 * ALL_SE))


@pytest.fixture
async def viewer(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    db = tmp_path / "t.db"
    store = Store(f"sqlite://{db}")
    await store.init()
    await store.add_job_sessions(
        [
            JobEnvironment(
                session_id=f"{j}-{env}-{case}-{i}",
                job_id=j,
                env_name=env,
                case_id=case,
                llm_model="m",
                group_id=f"{j}-{case}",
                sample_index=i,
            )
            for j, env, case, i, _, _ in SESSIONS
        ]
    )
    for j, env, case, i, reward, ev in SESSIONS:
        await store.update_job_session(
            f"{j}-{env}-{case}-{i}", finished=True, status="succeeded", reward=reward, eval_status=ev
        )
    await store.close()
    engine, queries = await open_queries(f"sqlite://{db}")
    app = create_app(queries, HiddenFields(tmp_path / "no-envs"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://viewer") as c:
        yield c
    await engine.dispose()


def _cells(page: str, env: str) -> list[str]:
    row = re.search(rf'<tr data-env="{env}">(.*?)</tr>', page, re.S)
    assert row, page[:2000]
    return [
        " ".join(html.unescape(re.sub(r"<[^>]+>", "", c)).split())
        for c in re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)
    ]


async def test_compare_page_pairs_the_common_cases_and_states_the_rest(viewer: httpx.AsyncClient) -> None:
    r = await viewer.get("/compare?a=A&b=B")
    assert r.status_code == 200
    # env, models, common, A only, B only, mean A, mean B, B - A, SE, 95% interval
    lo, hi = 3.75 - 12.7062047 * 6.25, 3.75 + 12.7062047 * 6.25
    assert _cells(r.text, "basics") == [
        "basics",
        "m / m",
        "2",
        "1",
        "1",
        "3.75",
        "7.50",
        "+3.75",
        "6.25",
        f"{lo:+.2f} to {hi:+.2f}",
    ]
    assert _cells(r.text, "other") == ["other", "m / m", "1", "0", "0", "4.00", "6.00", "+2.00", "-", "-"]
    diff = 7.0 - 11.5 / 3
    assert _cells(r.text, "all envs") == [
        "all envs",
        "m / m",
        "3",
        "1",
        "1",
        "3.83",
        "7.00",
        f"{diff:+.2f}",
        f"{ALL_SE:.2f}",
        f"{diff - 4.3026527 * ALL_SE:+.2f} to {diff + 4.3026527 * ALL_SE:+.2f}",
    ]
    note = " ".join(
        html.unescape(
            re.sub(
                r"<[^>]+>",
                "",
                re.search(r'<p class="muted" id="compare-note">(.*?)</p>', r.text, re.S).group(1),
            )
        ).split()
    )  # type: ignore[union-attr]
    assert "1 in A only, 1 in B only, left out" in note
    # each job on all its cases: A's basics is the mean of its 4 counted sessions (10, 5, 0, 10)
    jobs = re.search(r'<table class="grid" id="compare-jobs">(.*?)</table>', r.text, re.S)
    assert jobs and "6.25" in re.sub(r"<[^>]+>", "", jobs.group(1).split("basics", 1)[1].split("</tr>")[0])


async def test_compare_json(viewer: httpx.AsyncClient) -> None:
    r = await viewer.get("/api/compare?a=A&b=B")
    assert r.status_code == 200
    body = r.json()
    assert (body["a"], body["b"]) == ("A", "B")
    basics = body["envs"][0]
    assert {
        k: basics[k]
        for k in (
            "env",
            "models_a",
            "models_b",
            "common_cases",
            "only_a",
            "only_b",
            "mean_a",
            "mean_b",
            "diff",
        )
    } == {
        "env": "basics",
        "models_a": ["m"],
        "models_b": ["m"],
        "common_cases": 2,
        "only_a": 1,
        "only_b": 1,
        "mean_a": 3.75,
        "mean_b": 7.5,
        "diff": 3.75,
    }
    assert basics["diff_stderr"] == pytest.approx(6.25)
    assert basics["diff_ci95"] == pytest.approx([3.75 - 12.7062047 * 6.25, 3.75 + 12.7062047 * 6.25])
    assert body["envs"][1]["diff_stderr"] is None and body["envs"][1]["diff_ci95"] is None
    assert (body["all"]["env"], body["all"]["common_cases"]) == (None, 3)
    assert body["all"]["diff_stderr"] == pytest.approx(ALL_SE)
    assert (await viewer.get("/api/compare?a=A")).status_code == 400
    assert (await viewer.get("/api/compare?a=A&b=nope")).json() == {"error": "no job 'nope' in this store"}
    assert (await viewer.get("/api/compare?a=A&b=B&changed=1")).status_code == 400


@pytest.mark.parametrize("path", ["/jobs/A", "/jobs/A/report"])
async def test_job_page_and_report_show_standard_errors(viewer: httpx.AsyncClient, path: str) -> None:
    r = await viewer.get(path)
    assert r.status_code == 200
    table = re.search(r'<table class="grid summary">(.*?)</table>', r.text, re.S)
    assert table
    basics = table.group(1).split("<td>basics</td>", 1)[1].split("</tr>", 1)[0]
    cells = [
        html.unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(r"<td[^>]*>(.*?)</td>", basics, re.S)
    ]
    # mean of the 4 counted sessions, SE over the case means 7.5, 0, 10; pass@1 over 1/2, 0/1, 1/1
    se = statistics.stdev([7.5, 0.0, 10.0]) / math.sqrt(3)
    assert f"6.25±{se:.2f}" in cells and "6.25±3.00" in cells
    assert "0.500±0.289" in cells


def _text(fragment: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", fragment)).split())


async def test_home_page_gives_each_jobs_mean_its_standard_error_over_cases(
    viewer: httpx.AsyncClient,
) -> None:
    r = await viewer.get("/")
    assert r.status_code == 200
    means = dict(re.findall(r'<a href="/jobs/(\w)">.*?<td class="mean">(.*?)</td>', r.text, re.S))
    # A: 5 counted sessions (10, 5, 0, 10, 4) -> 5.80; its cases' means 7.5, 0, 10, 4
    se_a = statistics.stdev([7.5, 0.0, 10.0, 4.0]) / 2
    se_b = statistics.stdev([5.0, 10.0, 10.0, 6.0]) / 2
    assert (se_a, se_b) == (pytest.approx(2.17346689), pytest.approx(1.31497782))
    assert {k: _text(v) for k, v in means.items()} == {"A": "5.80±2.17 (4 cases)", "B": "7.75±1.31 (4 cases)"}


@pytest.mark.parametrize("path", ["/jobs/A", "/jobs/A/groups"])
async def test_group_tables_give_each_groups_mean_its_standard_error(
    viewer: httpx.AsyncClient, path: str
) -> None:
    r = await viewer.get(path)
    assert r.status_code == 200
    means = {
        gid: _text(cell)
        for gid, cell in re.findall(
            r'<tr data-group="([^"]+)">.*?<td class="mean">(.*?)</td></tr>', r.text, re.S
        )
    }
    # A-c1: 10 and 5 (SE 2.50); A-c2: the invalid reward's 0 (its grader_broken sample not counted)
    assert means == {
        "A-c1": "7.50±2.50 (2 samples)",
        "A-c2": "0.00 (1 sample)",
        "A-c3": "10.00 (1 sample)",
        "A-o1": "4.00 (1 sample)",
    }


async def test_group_page_gives_the_group_mean_its_standard_error(viewer: httpx.AsyncClient) -> None:
    def mean_line(page: str) -> str:
        found = re.search(r'<p id="group-mean">(.*?)</p>', page, re.S)
        assert found, page[:2000]
        return _text(found.group(1))

    assert mean_line((await viewer.get("/groups/A-c1")).text) == "mean score 7.50±2.50 (2 samples)"
    assert mean_line((await viewer.get("/groups/A-c2")).text) == (
        "mean score 0.00 (1 sample) · 1 without a score (not graded, or a broken grader)"
    )
    assert mean_line((await viewer.get("/groups/B-c3")).text) == (
        "mean score - · 1 without a score (not graded, or a broken grader)"
    )
