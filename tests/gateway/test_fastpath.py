"""The model-call paths served ahead of FastAPI (:mod:`gateway.fastpath`): which paths they are,
and that an error answered there has the same body as through FastAPI's handlers."""

from __future__ import annotations

import pytest

from gateway.fastpath import ModelCallPaths
from gateway.protocols import CHAT, MESSAGES, RESPONSES
from tests.gateway.conftest import Gateway


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/v1/sessions/s1/chat/completions", ("s1", CHAT)),
        ("/v1/sessions/s1/responses", ("s1", RESPONSES)),
        ("/v1/sessions/s1/v1/messages", ("s1", MESSAGES)),
        ("/v1/sessions/job a%41/chat/completions", ("job a%41", CHAT)),  # the ASGI path is decoded already
        ("/v1/chat/completions", (None, CHAT)),
        ("/v1/responses", (None, RESPONSES)),
        ("/v1/messages", (None, MESSAGES)),
        ("/v1/sessions/s1/chat/completions/", None),
        ("/v1/sessions//chat/completions", None),
        ("/v1/sessions/a/b/chat/completions", None),
        ("/v1/sessions/s1/close", None),
        ("/v1/sessions/s1/messages", None),
        ("/v2/chat/completions", None),
    ],
)
def test_model_call_paths(path: str, expected: tuple[str | None, object] | None) -> None:
    assert ModelCallPaths("/v1/sessions").match(path) == expected


def test_custom_session_path() -> None:
    paths = ModelCallPaths("/rollout/s")
    assert paths.match("/rollout/s/x/chat/completions") == ("x", CHAT)
    assert paths.match("/v1/sessions/x/chat/completions") is None


async def test_errors_keep_their_shape_on_the_fast_path(gw: Gateway) -> None:
    async with gw.http() as http:
        bad = await http.post("/v1/sessions/s/chat/completions", content=b"{not json")
        gone = await http.post(
            "/v1/sessions/s/v1/messages",
            json={"model": "nope", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
        )
        other = await http.get("/v1/chat/completions")
    assert bad.status_code == 400
    assert bad.json()["error"]["type"] == "invalid_request_error"
    assert gone.status_code == 404
    assert gone.json() == {
        "type": "error",
        "error": {"type": "not_found_error", "message": gone.json()["error"]["message"]},
    }
    assert "nope" in gone.json()["error"]["message"]
    assert other.status_code == 405
    assert other.headers["allow"] == "POST"
    assert other.json()["error"]["type"] == "invalid_request_error"
