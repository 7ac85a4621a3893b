"""The JSONL request log: secrets removed, bodies cut at the limit, size-based rotation."""

from __future__ import annotations

import json
from pathlib import Path

from gateway.request_log import RequestLog
from gateway.settings import RequestLogSettings


def _lines(path: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_lines_are_redacted_and_cut(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "req.jsonl"
    log = RequestLog(RequestLogSettings(enabled=True, path=str(path), body_limit_bytes=200))
    log.start()
    try:
        log.write(
            session_id="s1",
            route="r",
            endpoint="chat.completions",
            http_status=200,
            step_status="ok",
            latency_ms=1.23456,
            request={"model": "r", "api_key": "sk-secret", "max_tokens": 5},
            response={"choices": [{"message": {"content": "x" * 1000}}]},
        )
    finally:
        log.stop()
    (line,) = _lines(path)
    assert (line["session_id"], line["http_status"], line["latency_ms"]) == ("s1", 200, 1.235)
    assert line["request"] == {"model": "r", "api_key": "[REDACTED]", "max_tokens": 5}
    assert line["response"]["truncated"] is True and len(line["response"]["prefix"].encode()) == 200
    assert "sk-secret" not in path.read_text()


def test_rotation_keeps_backup_count_files(tmp_path: Path) -> None:
    path = tmp_path / "req.jsonl"
    log = RequestLog(RequestLogSettings(enabled=True, path=str(path), max_bytes=2000, backup_count=2))
    log.start()
    try:
        for i in range(100):
            log.write(
                session_id=f"s{i}",
                route="r",
                endpoint="chat.completions",
                http_status=200,
                step_status="ok",
                latency_ms=1.0,
                request={"i": i},
                response={"pad": "y" * 100},
            )
    finally:
        log.stop()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["req.jsonl", "req.jsonl.1", "req.jsonl.2"]
    assert all(p.stat().st_size <= 2000 for p in tmp_path.iterdir())
    assert _lines(path)[-1]["session_id"] == "s99"


async def test_gateway_logs_each_call(tmp_path: Path) -> None:
    from tests.fake_upstream import DEFAULT_TEXT, FakeUpstream
    from tests.gateway.conftest import CLIENT_KEY, MESSAGES, ROUTE_KEY, make_settings, serve

    path = tmp_path / "req.jsonl"
    async with FakeUpstream() as up:
        gw = await serve(
            make_settings(up, f"sqlite://{tmp_path}/gw.db", request_log={"enabled": True, "path": str(path)})
        )
        try:
            await gw.client("s1").chat.completions.create(model="m", messages=MESSAGES)
            raw = await gw.http().post(
                "/v1/chat/completions",
                json={"model": "m", "messages": MESSAGES},
                headers={"Authorization": f"Bearer {CLIENT_KEY}"},
            )
            assert raw.status_code == 200
        finally:
            await gw.stop()
    first, second = _lines(path)
    assert (first["session_id"], first["route"], first["http_status"], first["step_status"]) == (
        "s1",
        "m",
        200,
        "ok",
    )
    assert first["response"]["choices"][0]["message"]["content"] == DEFAULT_TEXT
    assert first["request"]["messages"] == MESSAGES
    assert second["session_id"] is None  # passthrough calls are logged too
    text = path.read_text()
    assert ROUTE_KEY not in text and CLIENT_KEY not in text


def test_a_lone_surrogate_is_logged_as_its_escape(tmp_path: Path) -> None:
    path = tmp_path / "req.jsonl"
    log = RequestLog(RequestLogSettings(enabled=True, path=str(path)))
    log.start()
    try:
        log.write(
            session_id="s1",
            route="r",
            endpoint="chat.completions",
            http_status=200,
            step_status="ok",
            latency_ms=1.0,
            request={"messages": [{"role": "user", "content": "a\ud800"}]},
            response={"choices": [{"message": {"content": "b\udfff"}}]},
        )
    finally:
        log.stop()
    (line,) = _lines(path)
    assert line["request"]["messages"][0]["content"] == "a\ud800"
    assert line["response"]["choices"][0]["message"]["content"] == "b\udfff"
    assert "\\ud800" in path.read_text(encoding="utf-8")
