"""Reading many sessions in headless Chromium, on the two real jobs of the toy env (see conftest):
previous / next within a filtered list, full-text search of the transcripts, the kept workspace as
a file tree (the agent's hostile file names, links and bytes), the job's groups, a compared case
opening both jobs, every page within a 1400 px window (a group of four samples side by side, more
scrolling in their own box), and ``report --bundle`` opened from disk."""

from __future__ import annotations

import asyncio
import re
import sqlite3
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rollout.servers.viewer.bundle import write_bundle
from rollout.servers.viewer.stats import HiddenFields
from tests.viewer.conftest import REPO, Jobs, Viewer, launcher_env
from tests.viewer.group_store import GROUP, fill
from tests.viewer.toy_env import RIGHT, SCRIPT_FILE, SCRIPT_TEXT, TOOL_END, WRONG


def rows(db: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    con = sqlite3.connect(db)
    try:
        return con.execute(sql, args).fetchall()
    finally:
        con.close()


def sid_of(jobs: Jobs, job: str, case: str, sample: int) -> str:
    return str(
        rows(
            jobs.db,
            "select env_id from job_environments where job_id=? and case_id=? and sample_index=?",
            job,
            case,
            sample,
        )[0][0]
    )


def fits(page: Any) -> tuple[int, int]:
    """(document width, window width): a page fits when the first is not above the second."""
    return page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")


def test_previous_and_next_walk_the_filtered_list_and_keep_its_filters(
    jobs: Jobs, viewer: Viewer, page: Any
) -> None:
    failed = {
        r[0]
        for r in rows(jobs.db, "select env_id from job_environments where job_id='jobA' and status='failed'")
    }
    assert len(failed) == 2
    page.goto(f"{viewer.url}/jobs/jobA/sessions?status=failed&sort=score&dir=desc")
    listed = [r.get_attribute("data-session") for r in page.locator("#sessions tbody tr").all()]
    assert set(listed) == failed
    page.locator("#sessions tbody tr").first.locator("a").first.click()
    page.wait_for_url(re.compile(rf"/sessions/{listed[0]}\?"))
    assert "status=failed" in page.url and "sort=score" in page.url and "dir=desc" in page.url
    assert page.locator("#list-position").inner_text() == "1 of 2"
    assert page.locator("#prev-session").count() == 0
    page.click("#next-session")
    page.wait_for_url(re.compile(rf"/sessions/{listed[1]}\?.*status=failed"))
    assert (
        page.locator("#list-position").inner_text() == "2 of 2" and page.locator("#next-session").count() == 0
    )
    page.keyboard.press("k")  # the key of the previous session
    page.wait_for_url(re.compile(rf"/sessions/{listed[0]}\?"))
    page.click("#back-to-list")
    page.wait_for_url(re.compile(r"/jobs/jobA/sessions\?.*status=failed"))
    assert page.locator("#sessions tbody tr").count() == 2
    unfiltered = [
        r[0]
        for r in rows(
            jobs.db,
            "select env_id from job_environments where job_id='jobA' "
            "order by env_name, case_id, sample_index, env_id",
        )
    ]
    page.goto(f"{viewer.url}/sessions/{unfiltered[2]}")  # opened without a list: the job's sessions in order
    assert page.locator("#list-position").inner_text() == "3 of 6"
    assert page.locator("#next-session").get_attribute("href") == f"/sessions/{unfiltered[3]}"
    assert page.goto(f"{viewer.url}/sessions/{unfiltered[2]}?status=nope").status == 400


def test_search_finds_the_wrong_answer_and_opens_its_step(jobs: Jobs, viewer: Viewer, page: Any) -> None:
    wrong = sid_of(jobs, "jobA", "logs", 1)
    page.goto(f"{viewer.url}/jobs/jobA")
    page.fill("#search-box", WRONG.lower())
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r"/search\?q="))
    answered_wrong = {
        r[0]
        for r in rows(
            jobs.db,
            "select env_id from job_environments where job_id='jobA' and eval_reason like ?",
            f"%got '{WRONG}'",
        )
    }
    hits = page.locator("#hits li[data-session]")
    assert {h.get_attribute("data-session") for h in hits.all()} == answered_wrong and len(
        answered_wrong
    ) == 2
    hit = page.locator(f"#hits li[data-session='{wrong}']")
    assert [m.upper() for m in hit.locator("mark").all_inner_texts()] == [WRONG]
    hit.locator("a.hit-link").click()
    seq = rows(jobs.db, "select max(seq) from session_steps where session_id=?", wrong)[0][0]
    page.wait_for_url(re.compile(rf"/sessions/{wrong}#step-{seq}$"))
    assert page.locator(f"#step-{seq} .answer").inner_text().strip().endswith(WRONG)
    # every word in one step: the tool output's words, in the sessions of jobA that read the log
    page.goto(f"{viewer.url}/search?q=failed+password+{TOOL_END}&job=jobA")
    found = {h.get_attribute("data-session") for h in page.locator("#hits li[data-session]").all()}
    read_log = {
        r[0]
        for r in rows(jobs.db, "select env_id from job_environments where job_id='jobA' and case_id='logs'")
    }
    assert found == read_log and len(found) == 2
    page.goto(f"{viewer.url}/search?q=failed+{RIGHT}+nosuchword")
    assert page.locator("#hits li[data-session]").count() == 0
    assert "No step holds every one of these words." in page.locator("#hits").inner_text()
    assert page.goto(f"{viewer.url}/search?q=x&job=nope").status == 404


JOBLESS_STORE = """
import asyncio, sys
from store import GatewaySession, SessionStep, Store

async def main(url):
    store = Store(url)
    await store.init()
    steps = [SessionStep(session_id="rollout-7", seq=k, step_id=k, llm_model="fake", endpoint="chat.completions",
                         messages=[{"role": "user", "content": f"question {k}"}],
                         response={"choices": [{"message": {"role": "assistant", "content": text},
                                                "finish_reason": "stop"}]},
                         finish_reason="stop", meta_json={"session_header": "x-session-id"})
             for k, text in ((1, "thinking <b>bold</b>"), (2, "final answer quokka"))]
    await store.write_batch(steps, [GatewaySession(session_id="rollout-7", route="fake", status="closed",
                                                   total_steps=2, max_steps=8, close_reason="client closed")])
    await store.close()

asyncio.run(main(sys.argv[1]))
"""


def test_a_session_without_a_job_opens_from_the_home_page_and_from_search(
    jobs: Jobs, page: Any, tmp_path: Path
) -> None:
    """A store holding only a session a client named by header (no launcher row, as inspect_ai /
    verifiers leave): listed from the home page, its page shows its steps, and search opens it."""
    db = tmp_path / "jobless.db"
    made = subprocess.run(
        [sys.executable, "-c", JOBLESS_STORE, f"sqlite://{db}"],
        capture_output=True,
        text=True,
        env=launcher_env(),
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    own = Viewer(db, jobs.env_root, tmp_path)
    try:
        page.goto(f"{own.url}/")
        assert "holds no job yet" not in page.locator("main").inner_text()
        page.locator("#jobless-entry a").click()
        page.wait_for_url(re.compile(r"/gateway-sessions$"))
        row = page.locator("#jobless tr[data-session='rollout-7']")
        assert (
            row.locator("td").nth(1).inner_text() == "fake" and row.locator("td").nth(3).inner_text() == "2"
        )
        row.locator("a").click()
        page.wait_for_url(re.compile(r"/sessions/rollout-7$"))
        assert page.locator("#step-2 .answer").inner_text().strip().endswith("final answer quokka")
        assert "thinking <b>bold</b>" in page.locator("#step-1 .answer").inner_text()  # shown as text
        assert page.locator("#step-1 .answer b").count() == 0
        assert "no reward until launcher.py grade grades it" in page.locator("#verdict").inner_text()
        assert "client closed" in page.locator("#gateway-state").inner_text()
        page.fill("#search-box", "quokka")
        page.keyboard.press("Enter")
        page.wait_for_url(re.compile(r"/search\?q="))
        for _ in range(50):  # the start's indexing runs beside the first searches: search again until done
            if page.locator("#search-pending").count() == 0:
                break
            page.reload()
        hit = page.locator("#hits li[data-session='rollout-7']")
        assert "no job" in hit.inner_text()
        hit.locator("a.hit-link").click()
        page.wait_for_url(re.compile(r"/sessions/rollout-7#step-2$"))
        assert page.locator("#step-2").is_visible()
    finally:
        own.stop()


def test_the_workspace_tree_shows_the_agents_files_as_text(
    jobs: Jobs, viewer: Viewer, page: Any, tmp_path: Path
) -> None:
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    sid = sid_of(jobs, "jobA", "logs", 0)
    page.goto(f"{viewer.url}/sessions/{sid}")
    page.click("#workspace-link")
    page.wait_for_url(re.compile(rf"/sessions/{sid}/workspace$"))
    tree = page.locator("#tree")
    assert [e.get_attribute("data-path") for e in tree.locator("li").all()] == [
        "inner-link",
        "notes",
        f"notes/{SCRIPT_FILE}",
        "notes/blob.bin",
    ]  # the link to /etc/passwd was not kept
    assert "→ notes/blob.bin (link, not followed)" in tree.inner_text()
    tree.locator(f"li[data-path='notes/{SCRIPT_FILE}'] a").click()
    page.wait_for_url(re.compile(r"\?path=notes%2F"))
    page.screenshot(path=tmp_path / "workspace.png", full_page=True)
    assert page.locator("#file-text").inner_text().startswith(SCRIPT_TEXT)
    assert page.title().startswith("workspace of") and dialogs == []  # shown, not run
    width, window = fits(page)
    assert width <= window, (width, window)  # a 6,800-character line wraps
    raw = page.request.get(page.locator("#raw-link").evaluate("a => a.href"))
    assert raw.status == 200 and raw.text().startswith(SCRIPT_TEXT)
    assert raw.headers["content-type"] == "text/plain; charset=utf-8"
    assert raw.headers["x-content-type-options"] == "nosniff"
    page.goto(f"{viewer.url}/sessions/{sid}/workspace?path=notes/blob.bin")
    assert page.locator("#binary").is_visible()
    for bad in ("inner-link", "passwd", "../../etc/passwd", "/etc/passwd"):
        response = page.goto(f"{viewer.url}/sessions/{sid}/workspace?path={bad}")
        assert response.status == 404 and "root:x:0" not in page.content(), bad


def test_job_page_lists_groups_and_compare_rows_open_both_jobs(jobs: Jobs, viewer: Viewer, page: Any) -> None:
    page.goto(f"{viewer.url}/jobs/jobA")
    groups = page.locator("#groups tbody tr")
    assert groups.count() == 3
    logs = groups.filter(has_text="logs")
    cells = logs.locator("td").all_inner_texts()
    # samples, finished, scored, passed, mean of 10 and 2 with its standard error
    assert cells[4:] == ["2", "2", "2", "1/2", "6.00±4.00 (2 samples)"]
    logs.locator("a").first.click()
    page.wait_for_url(re.compile(r"/groups/"))
    assert page.locator(".sample").count() == 2
    page.locator(".sample").nth(1).locator("p a").first.click()  # a sample: its group is the list
    page.wait_for_url(re.compile(r"/sessions/\w+\?group="))
    assert page.locator("#list-position").inner_text() == "2 of 2"
    page.goto(f"{viewer.url}/compare?a=jobA&b=jobB")
    page.locator("#compare-cases tr[data-case='logs'] a.both").click()
    page.wait_for_url(re.compile(r"/compare/case\?"))
    assert page.locator("#side-a tbody tr[data-session]").count() == 2
    assert page.locator("#side-b tbody tr[data-session]").count() == 1
    page.locator("#side-b tbody tr a").first.click()
    page.wait_for_url(re.compile(r"/sessions/.*case=logs"))
    assert page.locator("#list-position").inner_text() == "1 of 1"


def test_every_page_fits_1400_pixels(jobs: Jobs, viewer: Viewer, page: Any) -> None:
    sid = sid_of(jobs, "jobA", "logs", 1)
    seq = rows(jobs.db, "select max(seq) from session_steps where session_id=?", sid)[0][0]
    group = rows(jobs.db, "select group_id from job_environments where env_id=?", sid)[0][0]
    assert page.viewport_size["width"] == 1400
    for path in (
        "/",
        "/jobs/jobA",
        "/jobs/jobA/sessions",
        f"/sessions/{sid}",
        f"/sessions/{sid}/steps/{seq}",
        f"/groups/{group}",
        "/compare?a=jobA&b=jobB",
        f"/search?q={TOOL_END}",
        "/jobs/jobA/groups",
        f"/sessions/{sid}/workspace?path=notes/{SCRIPT_FILE}",
        "/compare/case?a=jobA&b=jobB&env=toy&case=logs",
    ):
        assert page.goto(viewer.url + path).status == 200, path
        page.evaluate(
            "document.querySelectorAll('details').forEach(d => d.open = true)"
        )  # tool results unfolded
        width, window = fits(page)
        assert width <= window, (path, width, window)


def test_a_group_of_four_fits_1400_pixels_and_more_scroll_in_their_box(page: Any, tmp_path: Path) -> None:
    db, ws = tmp_path / "groups.db", tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_text("a\n")
    with ThreadPoolExecutor(1) as pool:  # playwright's loop runs in this thread
        pool.submit(asyncio.run, fill(db, 4, ws)).result()
        pool.submit(asyncio.run, fill(db, 6, ws, group="grp-six", job="tj6")).result()
    (tmp_path / "envs").mkdir()
    viewer = Viewer(db, tmp_path / "envs", tmp_path)
    edges = (
        "(() => { const box = document.querySelector('.samples'); const b = box.getBoundingClientRect();"
        " return [Math.round(b.right), box.scrollWidth - box.clientWidth,"
        " ...[...box.querySelectorAll('.sample')].map(s => Math.round(s.getBoundingClientRect().right))]; })()"
    )
    try:
        assert page.goto(f"{viewer.url}/groups/{GROUP}").status == 200
        page.evaluate("document.querySelectorAll('details').forEach(d => d.open = true)")  # outputs unfolded
        width, window = fits(page)
        assert width <= window, (width, window)
        right, hidden, *samples = page.evaluate(edges)
        assert len(samples) == 4 and hidden == 0 and max(samples) <= right <= window, (right, samples)
        assert (
            page.locator(".samples .sample")
            .nth(3)
            .locator("details.user-output")
            .inner_text()
            .count("OUTPUT-OF-SAMPLE-3")
            == 1
        )
        assert page.goto(f"{viewer.url}/groups/grp-six").status == 200
        width, window = fits(page)
        assert width <= window, (width, window)
        right, hidden, *samples = page.evaluate(edges)
        assert len(samples) == 6 and hidden > 0 and samples[3] <= right < samples[5], (right, hidden, samples)
        assert page.locator("#scroll-hint").inner_text() == (
            "6 samples: scroll sideways in the box below for samples past the fourth."
        )
    finally:
        viewer.stop()
    with ThreadPoolExecutor(1) as pool:  # the bundle's group page, from disk, under its CSP
        pool.submit(
            asyncio.run, write_bundle(f"sqlite://{db}", "tj", tmp_path / "b", HiddenFields(tmp_path / "envs"))
        ).result()
    page.goto((tmp_path / "b" / "groups" / f"{GROUP}.html").as_uri())
    width, window = fits(page)
    right, hidden, *samples = page.evaluate(edges)
    assert width <= window and len(samples) == 4 and hidden == 0 and max(samples) <= right <= window, (
        right,
        samples,
    )


def test_bundle_opens_from_disk_without_a_server(jobs: Jobs, page: Any, tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "launcher.py"),
            "report",
            "--job-id",
            "jobA",
            "--bundle",
            str(out),
            "--db-path",
            f"sqlite://{jobs.db}",
            "--agent-root",
            str(jobs.env_root),
        ],
        capture_output=True,
        text=True,
        env=launcher_env(),
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    ids = [
        r[0]
        for r in rows(
            jobs.db,
            "select env_id from job_environments where job_id='jobA' "
            "order by env_name, case_id, sample_index, env_id",
        )
    ]
    assert sorted(p.name for p in (out / "sessions").iterdir()) == sorted(
        [f"{s}.html" for s in ids] + [f"{s}.json" for s in ids]
    )
    for f in out.rglob("*.html"):  # every link and asset relative, inside the folder
        for link in re.findall(r'(?:href|src)="([^"]*)"', f.read_text()):
            assert "://" not in link and not link.startswith(("/", "..//")) and "127.0.0.1" not in link, (
                f,
                link,
            )
    outside: list[str] = []

    def block(route: Any) -> None:
        outside.append(route.request.url)
        route.abort()

    page.route(re.compile(r"^(?!file:).*"), block)
    page.goto((out / "index.html").as_uri())
    page.wait_for_function(
        "[...document.querySelectorAll('.plotly-graph-div')]"
        ".every(d => d.querySelector('svg.main-svg g.trace'))",
        timeout=60_000,
    )
    assert page.locator("#sessions tbody tr").count() == 6
    wrong = sid_of(jobs, "jobA", "logs", 1)
    page.locator(f"#sessions tr[data-session='{wrong}'] td:first-child a").click()
    page.wait_for_url(re.compile(rf"sessions/{wrong}\.html$"))
    assert page.url.startswith("file://")
    assert page.locator("section.step").count() == 2
    assert page.locator("section.step").nth(1).locator(".answer").inner_text().strip().endswith(WRONG)
    assert page.locator("#list-position").inner_text() == f"{ids.index(wrong) + 1} of 6"
    assert (
        page.evaluate("getComputedStyle(document.querySelector('#verdict')).display") == "flex"
    )  # the styles loaded
    width, window = fits(page)
    assert width <= window, (width, window)
    assert ids.index(wrong) == 5 and page.locator("#next-session").count() == 0  # the last of the job
    page.click("#group-link")  # its group's page, the samples side by side
    page.wait_for_url(re.compile(r"groups/\w+\.html$"))
    assert page.locator(".samples .sample").count() == 2
    assert page.locator("#divergence").inner_text() == (
        "The samples answer alike through step 1; they first diverge at step 2."
    )
    page.locator(".samples .sample").nth(1).locator("p a").first.click()
    page.wait_for_url(re.compile(rf"sessions/{wrong}\.html$"))
    page.keyboard.press("k")
    page.wait_for_url(re.compile(rf"sessions/{ids[4]}\.html$"))
    page.click("#index-link")
    page.wait_for_url(re.compile(r"index\.html$"))
    assert outside == []
    again = subprocess.run(
        [
            sys.executable,
            str(REPO / "launcher.py"),
            "report",
            "--job-id",
            "jobB",
            "--bundle",
            str(out),
            "--db-path",
            f"sqlite://{jobs.db}",
            "--agent-root",
            str(jobs.env_root),
        ],
        capture_output=True,
        text=True,
        env=launcher_env(),
        timeout=300,
    )
    assert again.returncode == 0, again.stderr  # an earlier bundle is replaced, its sessions gone
    assert len(list((out / "sessions").glob("*.html"))) == 3
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    refused = subprocess.run(
        [
            sys.executable,
            str(REPO / "launcher.py"),
            "report",
            "--job-id",
            "jobB",
            "--bundle",
            str(tmp_path / "full"),
            "--db-path",
            f"sqlite://{jobs.db}",
        ],
        capture_output=True,
        text=True,
        env=launcher_env(),
        timeout=300,
    )
    assert refused.returncode == 1 and "is not empty and holds no earlier bundle" in refused.stderr
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["keep.txt"]
