"""The viewer's query parameters on a real SQLite store, in process: a parameter a page does not
take, one given twice, a value outside its range or vocabulary is a 400 page naming it (never a
500, never silently ignored); good values filter as before."""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from rollout.servers.viewer.app import create_app
from rollout.servers.viewer.db import open_queries
from rollout.servers.viewer.stats import HiddenFields
from store import JobEnvironment, Store


@pytest.fixture
async def viewer(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    db = tmp_path / "t.db"
    store = Store(f"sqlite://{db}")
    await store.init()
    await store.add_job_sessions(
        [
            JobEnvironment(
                session_id=f"s{i}",
                job_id="j",
                env_name="e",
                case_id=f"c{i}",
                llm_model="m",
                group_id=f"g{i}",
                sample_index=0,
            )
            for i in range(3)
        ]
    )
    await store.update_job_session("s0", finished=True, status="succeeded", reward=8.0, eval_status="scored")
    await store.update_job_session("s1", finished=True, status="failed", reward=2.0, eval_status="scored")
    await store.close()
    engine, queries = await open_queries(f"sqlite://{db}")
    app = create_app(queries, HiddenFields(tmp_path / "no-envs"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://viewer") as c:
        yield c
    await engine.dispose()


def message(r: httpx.Response) -> str:
    found = re.search(r'<p class="error-message">(.*?)</p>', r.text, re.S)
    assert found, r.text[:500]
    return html.unescape(found.group(1))


KNOWN = "env, case, model, status, eval, group, score_min, score_max, sort, dir, page"


@pytest.mark.parametrize(
    ("query", "text"),
    [
        (
            "page=99999999999999999999999",
            "page='99999999999999999999999' is not a page number (1 to 1000000000)",
        ),
        ("page=0", "page='0' is not a page number (1 to 1000000000)"),
        ("page=%C2%B2", "page='²' is not a page number (1 to 1000000000)"),
        ("min_score=3", f"unknown parameter 'min_score' (known: {KNOWN})"),
        ("page=1&page=2", "parameter 'page' is given more than once"),
        ("dir=sideways", "dir='sideways': use one of asc, desc"),
        (
            "status=bogus",
            "status='bogus': use one of cancelled, error, failed, pending, retrying, running, succeeded, "
            "timeout, truncated",
        ),
        (
            "eval=maybe",
            "eval='maybe': use one of error, grader_broken, infra_error, invalid_reward, none, scored, skipped, timeout",
        ),
        ("score_min=5&score_max=1", "score_min=5 is above score_max=1: no score can match"),
        ("score_max=inf", "score_max='inf' is not a finite number"),
    ],
)
async def test_bad_session_list_parameters_are_a_400_page_naming_them(
    viewer: httpx.AsyncClient, query: str, text: str
) -> None:
    r = await viewer.get(f"/jobs/j/sessions?{query}")
    assert (r.status_code, message(r)) == (400, text)


async def test_good_parameters_still_filter(viewer: httpx.AsyncClient) -> None:
    def shown(r: httpx.Response) -> list[str]:
        assert r.status_code == 200, r.text[:300]
        return re.findall(r'<tr data-session="([^"]+)"', r.text)

    assert shown(await viewer.get("/jobs/j/sessions")) == ["s0", "s1", "s2"]
    assert shown(await viewer.get("/jobs/j/sessions?status=failed")) == ["s1"]
    assert shown(await viewer.get("/jobs/j/sessions?status=cancelled")) == []  # known, just absent
    assert shown(await viewer.get("/jobs/j/sessions?eval=none")) == ["s2"]
    assert shown(await viewer.get("/jobs/j/sessions?score_min=2&score_max=2&dir=desc&page=1")) == ["s1"]
    assert shown(await viewer.get("/jobs/j/sessions?sort=score&dir=desc&case=&group=")) == ["s0", "s1", "s2"]
    r = await viewer.get("/jobs/j/sessions?page=2")
    assert (r.status_code, message(r)) == (404, "page 2 of 1: no such page")


async def test_compare_refuses_unknown_parameters(viewer: httpx.AsyncClient) -> None:
    r = await viewer.get("/compare?a=j&b=j&changd=1")
    assert (r.status_code, message(r)) == (400, "unknown parameter 'changd' (known: a, b, changed, page)")
    assert (await viewer.get("/compare?a=j&b=j&changed=1")).status_code == 200
