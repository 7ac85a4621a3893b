"""``launcher.py report --bundle DIR``: one job as a folder that opens from disk without a server.

``index.html`` is the job's report (plots, summary, reasons) with every session listed;
``sessions/<id>.html`` is each session's transcript (verdict, steps, start request without the
hidden fields, runtime result, evaluator's view) with its previous and next session in the job's
order, and its kept final workspace's file list (read from the archive, never extracted),
``sessions/<id>.json`` the same transcript as data, and ``groups/<id>.html`` each group's samples
side by side (the viewer's group page). No search: that needs the viewer. Links are relative; plotly.js and
the styles are files of the folder: nothing is loaded from the network (docs/output.md).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
from pathlib import Path
from typing import Any

from rollout.servers.viewer.db import ViewerError, open_queries
from rollout.servers.viewer.render import templates
from rollout.servers.viewer.report import _write_atomic, build_report, plotly_file_name, write_plotly_beside
from rollout.servers.viewer.stats import HiddenFields
from rollout.servers.viewer.trajectory_view import divergence, start_request_view, step_views
from rollout.servers.viewer.workspace_tree import WorkspaceError, entries
from store.engine import json_dumps
from store.queries import SessionFilter, ViewerQueries
from wire.text import display_text

MARKER = ".rollout-bundle"
"""The file that marks a folder as a bundle (only such a folder, or an empty one, is written over)."""
_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
KEYS_JS = """
document.addEventListener("keydown", function (e) {
  if (e.ctrlKey || e.metaKey || e.altKey) return;
  const link = document.getElementById(e.key === "j" ? "next-session" : e.key === "k" ? "prev-session" : "");
  if (link) link.click();
});
"""
"""The one script of a session page (keys j / k), allowed by its hash in the page's CSP: no other
script can run there."""
KEYS_SHA256 = base64.b64encode(hashlib.sha256(KEYS_JS.encode()).digest()).decode()


def session_file(session_id: str) -> str:
    """The file name (without suffix) of a session's page: its id when that is a safe file
    name, else a digest of it."""
    if _SAFE.fullmatch(session_id):
        return session_id
    return "s-" + hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _check_folder(folder: Path) -> None:
    if folder.exists() and not folder.is_dir():
        raise ViewerError(f"cannot write the bundle: {folder} is a file, not a folder")
    if folder.is_dir() and any(folder.iterdir()) and not (folder / MARKER).is_file():
        raise ViewerError(f"cannot write the bundle: {folder} is not empty and holds no earlier bundle")
    for parent in folder.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ViewerError(f"cannot write the bundle: {parent} is a file, not a folder")
            break


async def _job_rows(queries: ViewerQueries, job_id: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    while True:
        page = await queries.session_page(job_id, SessionFilter(), offset=len(rows), limit=500)
        rows += page.rows
        if not page.rows or len(rows) >= page.total:
            return rows


def _transcript(row: dict[str, Any], steps: list[dict[str, Any]], start: dict[str, Any]) -> dict[str, Any]:
    keep = (
        "env_id",
        "job_id",
        "env_name",
        "case_id",
        "sample_index",
        "group_id",
        "llm_model",
        "status",
        "reward",
        "eval_status",
        "eval_reason",
        "error_text",
        "duration_s",
        "attempts",
        "result",
    )
    views = step_views(steps)
    return {
        "session": {("session_id" if k == "env_id" else k): row.get(k) for k in keep},
        "start_request": start,
        "steps": [
            {
                "seq": v.row["seq"],
                "llm_model": v.row["llm_model"],
                "status": v.row["status"],
                "finish_reason": v.row.get("finish_reason"),
                "prompt_tokens": v.row.get("prompt_tokens"),
                "completion_tokens": v.row.get("completion_tokens"),
                "new_messages": (v.row.get("messages") or [])[v.new_from :]
                if isinstance(v.row.get("messages"), list)
                else v.row.get("messages"),
                "response": v.row.get("response"),
            }
            for v in views
        ],
    }


async def _workspace(queries: ViewerQueries, sid: str) -> dict[str, Any] | None:
    """A session's kept workspace for its bundle page: the row's ``status``, ``reason``, counts and,
    when kept, ``tree`` and ``more`` (its entries) or ``problem`` (the archive cannot be read)."""
    kept = await queries.workspace(sid)
    if kept is None:
        return None
    out = {k: kept[k] for k in ("status", "reason", "file_count", "total_bytes")}
    if kept["archive"] is not None:
        try:
            out["tree"], out["more"] = entries(kept["archive"])
        except WorkspaceError as e:
            out["problem"] = str(e)
    return out


async def _write_groups(
    queries: ViewerQueries, job_id: str, folder: Path, gids: list[str], files: dict[str, str]
) -> None:
    """``groups/<id>.html``: each group's samples of this job side by side, as the viewer's group page."""
    page = templates().get_template("bundle_group.html")
    for gid in gids:
        members = [m for m in await queries.group(gid) if m["job_id"] == job_id]
        by_sid = await queries.steps_of([m["env_id"] for m in members])
        samples = [step_views(by_sid[m["env_id"]]) for m in members]
        common, diffs = divergence(samples)
        html = page.render(
            group_id=gid,
            members=members,
            samples=samples,
            common=common,
            diffs=diffs,
            longest=max((len(s) for s in samples), default=0),
            hrefs=[f"../sessions/{files[m['env_id']]}.html" for m in members],
        )
        _write_atomic(folder / "groups" / f"{session_file(gid)}.html", display_text(html).encode("utf-8"))


async def write_bundle(db_url: str, job_id: str, folder: Path, hidden: HiddenFields) -> Path:
    """Write the bundle of ``job_id`` into ``folder`` (created; an earlier bundle there is
    replaced); returns the index's path. Raises ViewerError (the store cannot be read, no such
    job, or ``folder`` is a file or a non-empty folder that is no bundle)."""
    folder = Path(folder)
    _check_folder(folder)
    engine, queries = await open_queries(db_url)
    try:
        if await queries.job(job_id) is None:
            raise ViewerError(f"no job {job_id!r} in this store")
        rows = await _job_rows(queries, job_id)
        files = {r["env_id"]: session_file(r["env_id"]) for r in rows}
        gids = list(dict.fromkeys(r["group_id"] for r in rows if r.get("group_id")))
        for sub in ("sessions", "groups"):
            if (folder / sub).is_dir():
                shutil.rmtree(folder / sub)
            (folder / sub).mkdir(parents=True)
        (folder / MARKER).write_text(
            f"a bundle of job {job_id}: launcher.py report --bundle\n", encoding="utf-8"
        )
        css = (Path(__file__).resolve().parent / "static" / "viewer.css").read_bytes()
        _write_atomic(folder / "viewer.css", css)
        page = templates().get_template("bundle_session.html")
        for i, r in enumerate(rows):
            sid = r["env_id"]
            row = await queries.session(sid) or r
            steps = await queries.steps(sid)
            hidden_fields = hidden.of(row["env_name"])
            start = start_request_view(row, hidden_fields)
            prev = files[rows[i - 1]["env_id"]] if i > 0 else None
            nxt = files[rows[i + 1]["env_id"]] if i + 1 < len(rows) else None
            html = page.render(
                s=row,
                steps=step_views(steps),
                start=start,
                hidden_fields=hidden_fields,
                dataset=(row.get("env_params") or {}).get("dataset"),
                prev=prev,
                next=nxt,
                position=i + 1,
                total=len(rows),
                me=files[sid],
                keys_js=KEYS_JS,
                keys_sha256=KEYS_SHA256,
                workspace=await _workspace(queries, sid),
                group_file=session_file(row["group_id"]) if row.get("group_id") else None,
            )
            _write_atomic(folder / "sessions" / f"{files[sid]}.html", display_text(html).encode("utf-8"))
            data = json_dumps(_transcript(row, steps, start))
            _write_atomic(
                folder / "sessions" / f"{files[sid]}.json",
                json.dumps(json.loads(data), indent=1, ensure_ascii=False).encode("utf-8"),
            )
        await _write_groups(queries, job_id, folder, gids, files)
        write_plotly_beside(folder)
        index = await build_report(
            queries,
            job_id,
            viewer_url="",
            inline_js=False,
            plotly_src=plotly_file_name(),
            session_href=lambda sid: f"sessions/{files.get(sid, session_file(sid))}.html",
            group_href=lambda gid: f"groups/{session_file(gid)}.html",
            bundle=rows,
        )
    finally:
        await engine.dispose()
    _write_atomic(folder / "index.html", index.encode("utf-8"))
    return folder / "index.html"
