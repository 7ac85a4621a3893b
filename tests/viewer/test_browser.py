"""The viewer and the report in headless Chromium, on two real jobs of the toy env (see conftest):
job list, a session and its tool result, the hidden fields, filters, a group, two jobs compared,
bad ids, and the report file offline. Screenshots go to each test's tmp folder."""

from __future__ import annotations

import math
import re
import sqlite3
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from rollout.servers.viewer.report import plotly_file_name, plotly_js
from tests.viewer.conftest import REPO, Jobs, Viewer, launcher_env
from tests.viewer.toy_env import SECRET, TOOL_END, WRONG


def one(db: Path, sql: str, *args: Any) -> Any:
    con = sqlite3.connect(db)
    try:
        row = con.execute(sql, args).fetchone()
        return row[0] if row is not None and len(row) == 1 else row
    finally:
        con.close()


def session_of(jobs: Jobs, job: str, case: str, sample: int) -> str:
    return str(
        one(
            jobs.db,
            "select env_id from job_environments where job_id=? and case_id=? and sample_index=?",
            job,
            case,
            sample,
        )
    )


def test_new_user_finds_the_worst_session_and_its_reason_in_three_clicks(
    jobs: Jobs, viewer: Viewer, page: Any, tmp_path: Path
) -> None:
    worst_sid, worst_reason = one(
        jobs.db,
        "select env_id, eval_reason from job_environments where job_id='jobA' "
        "order by reward is not null, reward, env_name, case_id, sample_index limit 1",
    )
    page.goto(viewer.url + "/")
    page.screenshot(path=tmp_path / "1-jobs.png", full_page=True)
    rows = page.locator("#jobs tbody tr")
    assert rows.count() == 2
    assert "6/6" in rows.filter(has_text="jobA").inner_text()
    page.click("#jobs >> text=jobA")  # click 1
    page.screenshot(path=tmp_path / "2-job.png", full_page=True)
    assert page.locator("#job-state").inner_text() == "finished"
    page.click("#lowest")  # click 2: sessions, lowest score first
    page.screenshot(path=tmp_path / "3-lowest.png", full_page=True)
    first = page.locator("#sessions tbody tr").first
    assert first.get_attribute("data-session") == worst_sid
    first.locator("a").first.click()  # click 3
    page.screenshot(path=tmp_path / "4-session.png", full_page=True)
    assert page.locator("#eval-reason").inner_text() == worst_reason
    assert page.locator("#verdict .score").inner_text() == "2.00"
    assert (tmp_path / "4-session.png").stat().st_size > 10_000


def test_session_page_shows_steps_and_expands_a_tool_result(
    jobs: Jobs, viewer: Viewer, page: Any, tmp_path: Path
) -> None:
    sid = session_of(jobs, "jobA", "logs", 1)
    page.goto(f"{viewer.url}/jobs/jobA/sessions?case=logs")
    page.click(f"tr[data-session='{sid}'] >> a >> nth=0")
    assert page.url.endswith(f"/sessions/{sid}?case=logs")  # the list it was opened from
    steps = page.locator("section.step")
    assert steps.count() == one(jobs.db, "select count(*) from session_steps where session_id=?", sid) == 2
    assert "read_log" in steps.nth(0).locator(".answer").inner_text()
    assert steps.nth(1).locator(".answer").inner_text().strip().endswith(WRONG)
    result = steps.nth(1).locator("details.tool-result")
    body = result.locator("pre")
    assert not body.is_visible()
    result.locator("summary").click()
    body.wait_for(state="visible")
    page.screenshot(path=tmp_path / "tool-result.png", full_page=True)
    text = body.inner_text()
    assert text.rstrip().endswith(TOOL_END) and text.count("Failed password") == 120  # the full output
    assert re.search(r"tokens 5 in / 3 out", steps.nth(0).inner_text())
    assert "3 earlier messages sent again" in steps.nth(1).inner_text()
    steps.nth(1).locator("text=the whole conversation of this step").click()
    conversation = page.locator("#conversation .msg .role").all_inner_texts()
    assert conversation == ["system", "user", "assistant", "tool"]
    assert page.goto(f"{viewer.url}/sessions/{sid}/steps/9").status == 404


def test_start_request_never_shows_hidden_fields(jobs: Jobs, viewer: Viewer, page: Any) -> None:
    sid = session_of(jobs, "jobA", "logs", 0)
    page.goto(f"{viewer.url}/sessions/{sid}")
    start = page.locator("#start-request").inner_text()
    assert '"q": "How many failed logins?"' in start
    assert SECRET not in start and '"expected"' not in start and '"secret"' not in start
    trajectory = page.locator("section.step").all_inner_texts()
    assert not any(SECRET in t for t in trajectory)
    evaluator = page.locator("#evaluator-view").inner_text()
    assert SECRET in evaluator and "hidden from the agent: expected secret" in evaluator


def test_filter_by_status_and_sort_by_score(jobs: Jobs, viewer: Viewer, page: Any, tmp_path: Path) -> None:
    failed = one(jobs.db, "select count(*) from job_environments where job_id='jobA' and status='failed'")
    assert failed == 2
    page.goto(f"{viewer.url}/jobs/jobA/sessions")
    assert page.locator("#sessions tbody tr").count() == 6
    page.select_option("#f-status", "failed")
    page.click("#apply")
    page.wait_for_url(re.compile(r"status=failed"))
    page.screenshot(path=tmp_path / "filtered.png", full_page=True)
    rows = page.locator("#sessions tbody tr")
    assert rows.count() == failed
    assert all("failed" in t for t in rows.locator("td:nth-child(8)").all_inner_texts())
    assert page.locator("#count").inner_text().startswith("2 sessions")
    page.goto(f"{viewer.url}/jobs/jobA/sessions?sort=score&dir=desc&score_min=5")
    scores = page.locator("#sessions tbody td:nth-child(10)").all_inner_texts()
    assert scores == ["10.00", "10.00"]


def test_group_shows_samples_side_by_side_and_where_they_diverge(
    jobs: Jobs, viewer: Viewer, page: Any, tmp_path: Path
) -> None:
    page.goto(f"{viewer.url}/sessions/{session_of(jobs, 'jobA', 'logs', 0)}")
    page.click("#group-link")
    page.screenshot(path=tmp_path / "group.png", full_page=True)
    samples = page.locator(".sample")
    assert samples.count() == 2
    assert (
        "10.00" in samples.nth(0).locator("h2").inner_text()
        and "2.00" in samples.nth(1).locator("h2").inner_text()
    )
    assert "first diverge at step 2" in page.locator("#divergence").inner_text()
    assert samples.nth(1).locator(".gstep.diverged").count() == 1
    assert samples.nth(0).locator(".gstep.diverged").count() == 0


def test_compare_two_jobs(jobs: Jobs, viewer: Viewer, page: Any, tmp_path: Path) -> None:
    page.goto(f"{viewer.url}/jobs/jobA")
    page.select_option("select[name=b]", "jobB")
    page.click("form.inline button")
    page.wait_for_url(re.compile(r"/compare\?a=jobA&b=jobB"))
    page.screenshot(path=tmp_path / "compare.png", full_page=True)
    logs = page.locator("#compare-cases tr[data-case='logs']").inner_text()
    assert "(1/2)" in logs and "(1/1)" in logs and "+4.00" in logs  # A: 10 and 2, B: 10
    crash = page.locator("#compare-cases tr[data-case='crash']").inner_text()
    assert "+0.00" in crash
    env_row = page.locator("#compare-envs tbody tr").inner_text()
    assert "4.67" in env_row and "7.33" in env_row  # mean scores, as the launcher's table printed
    assert "4.67" in jobs.outputs["jobA"][1] and "7.33" in jobs.outputs["jobB"][1]


def test_standard_errors_in_the_browser(jobs: Jobs, viewer: Viewer, page: Any) -> None:
    """The job page, the comparison and the home page show each mean with its standard error over
    cases (docs/output.md, "Standard errors"), as Chromium renders them. The case means: jobA crash
    2, direct 6 (10, 2), logs 6 (10, 2); jobB crash 2, direct 10, logs 10."""
    assert (
        one(
            jobs.db,
            "select group_concat(reward) from (select reward from job_environments "
            "where job_id='jobA' order by case_id, sample_index)",
        )
        == "2.0,2.0,10.0,2.0,10.0,2.0"
    )
    se_a = statistics.stdev([2.0, 6.0, 6.0]) / math.sqrt(3)
    se_b = statistics.stdev([2.0, 10.0, 10.0]) / math.sqrt(3)
    se_pass_a = statistics.stdev([0.0, 0.5, 0.5]) / math.sqrt(3)
    se_diff = statistics.stdev([0.0, 4.0, 4.0]) / math.sqrt(3)
    assert [f"{x:.3f}" for x in (se_a, se_b, se_pass_a, se_diff)] == ["1.333", "2.667", "0.167", "1.333"]
    page.goto(f"{viewer.url}/jobs/jobA")
    summary = page.locator("table.summary tbody tr").first.locator("td").all_inner_texts()
    assert summary[8:10] == ["4.67±1.33", "0.333±0.167"]  # mean score, pass@1
    logs = page.locator("#groups tbody tr").filter(has_text="logs").locator("td.mean").inner_text()
    assert logs == "6.00±4.00 (2 samples)"  # 10 and 2
    page.goto(f"{viewer.url}/compare?a=jobA&b=jobB")
    paired = page.locator("#compare-envs tbody tr").first.locator("td").all_inner_texts()
    # mean A, mean B, B - A, its paired SE, mean ± t(0.975, 2) · SE
    assert paired[5:] == ["4.67", "7.33", "+2.67", "1.33", "-3.07 to +8.40"]
    each = page.locator("#compare-jobs tbody tr").first.locator("td").all_inner_texts()
    assert each[3:7] == ["4.67±1.33", "7.33±2.67", "0.333±0.167", "0.667±0.333"]
    page.goto(f"{viewer.url}/")
    means = {
        r.locator("td").first.inner_text(): r.locator("td.mean").inner_text()
        for r in page.locator("#jobs tbody tr").all()
    }
    assert means == {"jobA": "4.67±1.33 (3 cases)", "jobB": "7.33±2.67 (3 cases)"}


def test_bad_ids_and_values_get_an_error_page_not_a_traceback(viewer: Viewer, page: Any) -> None:
    for path, code, text in (
        ("/sessions/nope", 404, "no session 'nope'"),
        ("/jobs/nope", 404, "no job 'nope'"),
        ("/groups/nope", 404, "no group 'nope'"),
        ("/jobs/jobA/sessions?score_min=abc", 400, "is not a number"),
        ("/jobs/jobA/sessions?page=99", 404, "no such page"),
        ("/compare?a=jobA&b=nope", 404, "no job 'nope'"),
    ):
        response = page.goto(viewer.url + path)
        assert response.status == code, path
        body = page.inner_text("body")
        assert text in body and "Traceback" not in body, path


def test_no_write_endpoint(viewer: Viewer, page: Any) -> None:
    for path in ("/", "/jobs/jobA", "/api/jobs"):
        assert page.request.post(viewer.url + path).status == 405
        assert page.request.delete(viewer.url + path).status == 405


def test_report_file_works_offline_and_its_plots_render(jobs: Jobs, page: Any, tmp_path: Path) -> None:
    assert jobs.outputs["jobA"][0] == 0 and f"report written to {jobs.report}" in jobs.outputs["jobA"][1]
    outside: list[str] = []

    def block(route: Any) -> None:
        outside.append(route.request.url)
        route.abort()

    page.route(re.compile(r"^(?!file:).*"), block)
    page.goto(jobs.report.as_uri())
    plots = page.locator(".plotly-graph-div")
    assert plots.count() == 6
    page.wait_for_function(
        "[...document.querySelectorAll('.plotly-graph-div')]"
        ".every(d => d.querySelector('svg.main-svg g.trace'))",
        timeout=60_000,
    )
    page.screenshot(path=tmp_path / "report.png", full_page=True)
    assert outside == []
    assert page.locator("#plot-scores .trace.bars path").count() >= 2  # bars at score 2 and 10
    assert page.locator("#plot-passk .scatterlayer .trace").count() == 1
    assert page.locator("#plot-latency .boxlayer .trace").count() >= 1
    summary = page.locator("table.summary tbody tr").inner_text()
    assert "4.67" in summary and "0.667" in summary
    links = page.locator("#worst a").evaluate_all("els => els.map(e => e.href)")
    ids = {
        str(r[0])
        for r in sqlite3.connect(jobs.db).execute("select env_id from job_environments where job_id='jobA'")
    }
    assert links and all(
        h.startswith("http://127.0.0.1:8765/sessions/") and h.rsplit("/", 1)[1] in ids for h in links
    )
    assert page.locator("#plotly-missing").is_hidden()
    alone = tmp_path / "alone.html"  # the report moved without the plotly.js file beside it
    alone.write_text(jobs.report.read_text())
    page.goto(alone.as_uri())
    assert page.locator("#plotly-missing").is_visible()
    assert (
        "could not be loaded, so the charts below are empty" in page.locator("#plotly-missing").inner_text()
    )


def test_report_command(jobs: Jobs, tmp_path: Path) -> None:
    out = tmp_path / "b.html"
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "launcher.py"),
            "report",
            "--job-id",
            "jobB",
            "--db-path",
            f"sqlite://{jobs.db}",
            "--out",
            str(out),
            "--viewer-url",
            "http://h:1",
        ],
        capture_output=True,
        text=True,
        env=launcher_env(),
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    html = out.read_text()
    assert "Report of job <code>jobB</code>" in html and 'href="http://h:1/sessions/' in html
    js = tmp_path / plotly_file_name()  # plotly.js once beside the reports, loaded by a relative path
    assert f'<script src="{js.name}"></script>' in html and js.read_text() == plotly_js()
    assert len(html) < 500_000 < js.stat().st_size
    one = tmp_path / "one" / "c.html"
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "launcher.py"),
            "report",
            "--job-id",
            "jobB",
            "--self-contained",
            "--db-path",
            f"sqlite://{jobs.db}",
            "--out",
            str(one),
        ],
        capture_output=True,
        text=True,
        env=launcher_env(),
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "<script src=" not in one.read_text() and plotly_js() in one.read_text()  # inlined
    assert [f.name for f in one.parent.iterdir()] == ["c.html"]
    bad = subprocess.run(
        [
            sys.executable,
            str(REPO / "launcher.py"),
            "report",
            "--job-id",
            "nope",
            "--db-path",
            f"sqlite://{jobs.db}",
            "--out",
            str(tmp_path / "x.html"),
        ],
        capture_output=True,
        text=True,
        env=launcher_env(),
        timeout=120,
    )
    assert bad.returncode == 1 and "no job 'nope'" in bad.stderr and not (tmp_path / "x.html").exists()
    (tmp_path / "afile").write_text("x")
    for out, problem in (
        (
            tmp_path / "one",
            f"{tmp_path / 'one'} is a folder; give the file's path (e.g. {tmp_path / 'one' / 'report.html'})",
        ),
        (tmp_path / "afile" / "r.html", f"{tmp_path / 'afile'} is a file, not a folder"),
    ):
        bad = subprocess.run(
            [
                sys.executable,
                str(REPO / "launcher.py"),
                "report",
                "--job-id",
                "jobB",
                "--db-path",
                f"sqlite://{jobs.db}",
                "--out",
                str(out),
            ],
            capture_output=True,
            text=True,
            env=launcher_env(),
            timeout=120,
        )
        assert (bad.returncode, bad.stderr.strip()) == (1, f"error: cannot write the report: {problem}")
    assert [f.name for f in one.parent.iterdir()] == ["c.html"] and (tmp_path / "afile").read_text() == "x"
