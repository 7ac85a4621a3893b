"""``launcher.py serve`` refuses what a web page could send to start a batch: a browser's request
(``Origin`` / ``Sec-Fetch-Site``) is a 403, a body that is not JSON a 415; nothing is submitted.
The serve app over a real SQLite store, the batch service's ``submit`` recorded instead of run."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from rollout.jobs.options import JobOptions
from rollout.servers.batches import BatchInfo, BatchRequest, BatchService, create_serve_app
from rollout.servers.feed.app import FeedSettings
from store import Store

BODY = b'{"envs": ["toy"], "policy_version": 7}'


class _Recorded(BatchService):
    submitted: list[BatchRequest]

    async def submit(self, req: BatchRequest) -> BatchInfo:
        self.submitted.append(req)
        return BatchInfo(
            job_id="j",
            state="queued",
            model="m",
            policy_version=req.policy_version,
            sessions=1,
            groups=1,
            submitted_at="now",
            feed="/v1/jobs/j/groups",
        )


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[_Recorded, httpx.AsyncClient]]:
    store = Store(f"sqlite://{tmp_path}/t.db")
    await store.init()
    service = _Recorded(
        store, JobOptions(gateway_config=tmp_path / "gw.yaml"), "http://127.0.0.1:9/v1/sessions", None, "m"
    )
    service.submitted = []
    app = create_serve_app(service, FeedSettings())
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1:8767"
    ) as c:
        yield service, c
    await store.close()


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
    ],
)
async def test_a_simple_request_starts_no_batch(
    served: tuple[_Recorded, httpx.AsyncClient], content_type: str
) -> None:
    service, http = served
    r = await http.post("/v1/batches", content=BODY, headers={"content-type": content_type})
    assert r.status_code == 415
    assert r.json() == {
        "error": {
            "message": f"POST /v1/batches takes a JSON body (Content-Type: application/json), not {content_type!r}",
            "type": "invalid_request_error",
            "param": None,
            "code": "unsupported_media_type",
        }
    }
    assert service.submitted == []


async def test_a_body_without_a_content_type_starts_no_batch(
    served: tuple[_Recorded, httpx.AsyncClient],
) -> None:
    service, http = served
    r = await http.post("/v1/batches", content=BODY)
    assert (r.status_code, r.json()["error"]["code"]) == (415, "unsupported_media_type")
    assert r.json()["error"]["message"] == (
        "POST /v1/batches has a body without a Content-Type; send it as Content-Type: application/json"
    )
    assert service.submitted == []


@pytest.mark.parametrize(
    "browser",
    [
        {"origin": "https://evil.example"},
        {"origin": "null"},
        {"sec-fetch-site": "cross-site"},
        {"sec-fetch-site": "same-site"},
    ],
)
async def test_a_request_from_a_web_page_starts_no_batch(
    served: tuple[_Recorded, httpx.AsyncClient], browser: dict[str, str]
) -> None:
    service, http = served
    r = await http.post("/v1/batches", content=BODY, headers={"content-type": "application/json", **browser})
    assert (r.status_code, r.json()["error"]["code"], r.json()["error"]["type"]) == (
        403,
        "cross_site_request",
        "permission_error",
    )
    assert service.submitted == []
    assert (await http.get("/v1/serve", headers=browser)).status_code == 200  # reads stay open


async def test_a_json_request_is_submitted(served: tuple[_Recorded, httpx.AsyncClient]) -> None:
    service, http = served
    r = await http.post(
        "/v1/batches", content=BODY, headers={"content-type": "application/json; charset=utf-8"}
    )
    assert r.status_code == 202, r.text
    assert [(q.envs, q.policy_version) for q in service.submitted] == [(["toy"], 7)]
