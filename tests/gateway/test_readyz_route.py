"""``GET /readyz?route=KEY``: the gateway is ready AND that route's upstream answers (what the
launcher's circuit breaker probes before it lets sessions run again)."""

from __future__ import annotations

from tests.fake_upstream import FakeUpstream, Reply
from tests.gateway.conftest import StartGateway


async def test_readyz_route_probes_the_upstream(start_gateway: StartGateway, upstream: FakeUpstream) -> None:
    gw = await start_gateway(routes={"m": {}, "dead": {"base_url": "http://127.0.0.1:9/v1"}})
    http = gw.http()
    r = await http.get("/readyz", params={"route": "m"})
    assert (r.status_code, r.json()["status"]) == (200, "ready")
    assert [(q.method, q.path) for q in upstream.requests] == [("GET", "/v1/models")]
    assert "authorization" not in upstream.requests[0].headers  # no credentials on a probe

    upstream.script("/v1/models", [Reply.json({"error": "overloaded"}, status=503)])
    r = await http.get("/readyz", params={"route": "m"})
    assert r.status_code == 503
    assert r.json()["error"] == "upstream of route m answered HTTP 503"

    r = await http.get("/readyz", params={"route": "dead"})
    assert r.status_code == 503 and "upstream of route dead does not answer" in r.json()["error"]
    # without ?route (or for an unknown route) only the gateway itself is checked
    assert (await http.get("/readyz")).status_code == 200
    assert (await http.get("/readyz", params={"route": "nosuch"})).status_code == 200
    assert len(upstream.requests) == 2
