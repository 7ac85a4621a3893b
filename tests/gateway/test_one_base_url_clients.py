"""The real inspect_ai and verifiers clients driving the gateway through ONE base URL (``/v1``,
no session in the path): each inspect sample and each verifiers rollout is its own session,
named by the header the client sends (``x-session-id``). Needs the ``clients`` extra."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fake_upstream import FakeUpstream
from tests.gateway.conftest import Gateway

# the clients' own deprecated calls and unclosed streams (tenacity, anyio in inspect_ai) are theirs
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::PendingDeprecationWarning",
                                        "ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning")


@pytest.fixture(autouse=True)
def _logging_restored() -> Iterator[None]:
    """Both clients configure logging when used (root level and handlers, their own loggers):
    undone afterwards, so the tests that run later in this process see the logging they expect."""
    names = ("", "httpx", "httpx2", "httpcore", "inspect_ai", "verifiers")
    saved = {n: (lg.level, list(lg.handlers), lg.propagate) for n in names if (lg := logging.getLogger(n))}
    yield
    for n, (level, handlers, propagate) in saved.items():
        lg = logging.getLogger(n)
        lg.setLevel(level)
        lg.handlers[:] = handlers
        lg.propagate = propagate


async def _sessions(gw: Gateway) -> dict[str, list[tuple[int, str | None]]]:
    """Each recorded session: its steps' ``(seq, meta_json.session_header)``, as the store reads them."""
    sids = [row["session_id"] for row in gw.sql("SELECT DISTINCT session_id FROM session_steps")]
    return {sid: [(s.seq, (s.meta_json or {}).get("session_header")) for s in await gw.steps(sid)] for sid in sids}


async def test_each_inspect_sample_is_its_own_session(gw: Gateway, upstream: FakeUpstream, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("inspect_ai", reason="the `clients` extra (inspect-ai) is not installed")
    from inspect_ai import Task, eval_async
    from inspect_ai.dataset import Sample
    from inspect_ai.scorer import includes
    from inspect_ai.solver import generate, user_message

    monkeypatch.setenv("INSPECT_DISPLAY", "none")
    monkeypatch.setenv("OPENROUTER_API_KEY", "unused")  # the gateway has no auth here
    task = Task(dataset=[Sample(input="q1", target="fake"), Sample(input="q2", target="fake")],
                solver=[generate(), user_message("again"), generate()], scorer=includes())
    # inspect's openrouter provider sends x-session-id: <sample uuid> with every call of a sample
    (log,) = await eval_async(task, model="openrouter/m", model_base_url=f"{gw.url}/v1", epochs=2,
                              max_retries=0, log_dir=str(tmp_path / "logs"))
    assert log.status == "success" and log.samples is not None
    uuids = {s.uuid for s in log.samples}
    assert len(uuids) == 4  # 2 samples x 2 epochs
    assert await _sessions(gw) == {u: [(1, "x-session-id"), (2, "x-session-id")] for u in uuids}
    assert {r.path for r in upstream.requests} == {"/v1/chat/completions"} and len(upstream.requests) == 8


async def test_each_verifiers_rollout_is_its_own_session(gw: Gateway, upstream: FakeUpstream,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("verifiers", reason="the `clients` extra (verifiers) is not installed")
    import verifiers as vf
    from datasets import Dataset
    from verifiers.types import ClientConfig

    class TwoTurns(vf.MultiTurnEnv):  # type: ignore[misc]
        async def env_response(self, messages: vf.Messages, state: vf.State, **kwargs: object) -> vf.Messages:
            return [{"role": "user", "content": "again"}]

    data = Dataset.from_list([{"question": "q1", "answer": "a"}, {"question": "q2", "answer": "b"}])
    env = TwoTurns(dataset=data, eval_dataset=data, max_turns=2,
                   rubric=vf.Rubric(funcs=[lambda completion, answer, **kw: 1.0]))
    monkeypatch.setenv("GATEWAY_API_KEY", "unused")
    # what `vf-eval` sets by default: X-Session-ID = the rollout's trajectory id
    client = ClientConfig(api_base_url=f"{gw.url}/v1", api_key_var="GATEWAY_API_KEY", max_retries=0,
                          extra_headers_from_state={"X-Session-ID": "trajectory_id"})
    out = await env.evaluate(client=client, model="m", num_examples=2, rollouts_per_example=2, max_concurrent=4,
                             on_progress=[], state_columns=["trajectory_id"])
    trajectories = {o["trajectory_id"] for o in out["outputs"]}
    assert len(trajectories) == 4  # 2 examples x 2 rollouts
    assert await _sessions(gw) == {t: [(1, "x-session-id"), (2, "x-session-id")] for t in trajectories}
    assert len(upstream.requests) == 8
