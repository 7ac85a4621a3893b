"""Token in, token out: a session's next prompt is its previous prompt + completion ids followed by
the new messages' rendering, never a re-render of the chat; a request that does not extend the
session's messages is rendered whole, marked and counted."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.settings import GatewaySettings
from rollout.train.continuation import Continuity, SessionPrompts
from rollout.train.hf_engine import TransformersEngine
from rollout.train.policy_server import PolicyServer
from rollout.train.tiny import tiny_policy
from tests.gateway.conftest import Gateway, serve

pytestmark = pytest.mark.train

SYSTEM = {"role": "system", "content": "You answer."}
GREEDY = {"model": "tiny", "max_tokens": 8, "temperature": 0, "return_token_ids": True}


@pytest.fixture(scope="module")
def policy() -> tuple[Any, Any]:
    return tiny_policy()


@pytest.fixture
def server(policy: tuple[Any, Any]) -> Iterator[PolicyServer]:
    with PolicyServer(*policy, model_name="tiny") as s:
        yield s


def post(
    server: PolicyServer, messages: list[dict[str, Any]], session: str | None, **body: Any
) -> dict[str, Any]:
    headers = {"X-Session-Id": session} if session else {}
    r = httpx.post(
        server.base_url + "/chat/completions",
        json={**GREEDY, "messages": messages, **body},
        headers=headers,
        timeout=60,
    )
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def stop_in(server: PolicyServer, messages: list[dict[str, Any]], session: str) -> str:
    """A stop string the greedy answer to ``messages`` meets: its third character (a probe; the
    same request again then gets the same prompt, so the same greedy tokens)."""
    text = post(server, messages, session)["choices"][0]["message"]["content"]
    assert len(text) >= 3, text
    return str(text[2])


def rendered(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def stats(server: PolicyServer) -> dict[str, Any]:
    out: dict[str, Any] = httpx.get(server.base_url.removesuffix("/v1") + "/stats").json()
    return out


def test_three_turns_are_one_sequence(server: PolicyServer, policy: tuple[Any, Any]) -> None:
    tokenizer = policy[1]
    messages: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": "Say hi."}]
    steps = []
    for turn in range(3):
        # a stop string: the text ends before it, the ids keep it, so a re-render of the text differs
        out = post(server, messages, "s1", stop=[stop_in(server, messages, "s1")])
        choice = out["choices"][0]
        assert choice["finish_reason"] == "stop" and choice["token_ids"][-1] != tokenizer.eos_token_id
        steps.append((out["prompt_token_ids"], choice["token_ids"], out.get("prompt_continuity")))
        messages = [*messages, choice["message"], {"role": "user", "content": f"Go on ({turn})."}]
    (p1, c1, how1), (p2, c2, how2), (p3, c3, how3) = steps
    # step 3's prompt is step 2's prompt + completion, then the turn's end and the new user turn
    assert p3[: len(p2) + len(c2)] == p2 + c2
    assert p1 == rendered(tokenizer, [SYSTEM, {"role": "user", "content": "Say hi."}])
    assert how1 == how2 == how3 == {"mode": "continued", "reason": None}  # step 1: its probe's prompt again
    assert p3 == p2 + c2 + encode(
        tokenizer, "<|im_end|>\n<|im_start|>user\nGo on (1).<|im_end|>\n<|im_start|>assistant\n"
    )
    assert p2 == p1 + c1 + encode(
        tokenizer, "<|im_end|>\n<|im_start|>user\nGo on (0).<|im_end|>\n<|im_start|>assistant\n"
    )
    # 3 probes + 3 calls: the first rendered, the others continued (a probe repeated is the same prompt)
    assert stats(server) == {
        "continue_sessions": True,
        "prompts": {"continued": 5, "rendered": 1, "fallback": 0},
        "fallback_reasons": {},
        "sessions": 1,
        "evicted": 0,
    }


@pytest.mark.parametrize("eos", [True, False])
def test_the_turns_end_is_added_unless_the_model_sampled_it(policy: tuple[Any, Any], eos: bool) -> None:
    tokenizer = policy[1]
    sessions = SessionPrompts(TransformersEngine(*policy))
    first = [SYSTEM, {"role": "user", "content": "Say hi."}]
    prompt, how = sessions.prompt("s", first, None)
    assert how == Continuity("rendered") and prompt == rendered(tokenizer, first)
    completion = encode(tokenizer, "Hi.") + ([tokenizer.eos_token_id] if eos else [])
    reply = {"role": "assistant", "content": "Hi."}
    sessions.keep("s", first, None, prompt, completion, reply)
    nxt, how = sessions.prompt("s", [*first, reply, {"role": "user", "content": "Again."}], None)
    assert how == Continuity("continued")
    assert nxt == prompt + completion + encode(
        tokenizer,
        ("" if eos else "<|im_end|>") + "\n<|im_start|>user\nAgain.<|im_end|>\n<|im_start|>assistant\n",
    )


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (
            lambda m: [m[0], m[1], {"role": "assistant", "content": "edited"}, m[3]],
            "messages[2] is not the assistant reply sampled for the previous request",
        ),
        (
            lambda m: [m[0], {"role": "user", "content": "Say bye."}, m[2], m[3]],
            "messages[1] differs from the previous request's (history edited)",
        ),
    ],
)
def test_an_edited_history_is_rendered_whole_marked_and_counted(
    server: PolicyServer, policy: tuple[Any, Any], edit: Any, reason: str
) -> None:
    tokenizer = policy[1]
    first = [SYSTEM, {"role": "user", "content": "Say hi."}]
    reply = post(server, first, "s3")["choices"][0]["message"]
    edited = edit([*first, reply, {"role": "user", "content": "Again."}])
    out = post(server, edited, "s3")
    assert out["prompt_continuity"] == {"mode": "fallback", "reason": reason}
    assert out["prompt_token_ids"] == rendered(tokenizer, edited)
    got = stats(server)
    assert got["prompts"] == {"continued": 0, "rendered": 1, "fallback": 1} and got["fallback_reasons"] == {
        reason: 1
    }
    # the session goes on from the fallback's ids
    again = post(server, [*edited, out["choices"][0]["message"], {"role": "user", "content": "More."}], "s3")
    assert again["prompt_continuity"]["mode"] == "continued"
    assert again["prompt_token_ids"][: len(out["prompt_token_ids"])] == out["prompt_token_ids"]


def test_without_a_session_or_when_off_the_chat_is_rendered(
    policy: tuple[Any, Any], server: PolicyServer
) -> None:
    tokenizer = policy[1]
    first = [SYSTEM, {"role": "user", "content": "Say hi."}]
    out = post(server, first, None)
    assert out["prompt_continuity"] == {"mode": "rendered", "reason": "no session id"}
    # a history with an assistant turn the server holds no ids for: rendered whole, counted
    history = [*first, {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "Again."}]
    assert post(server, history, "s4")["prompt_continuity"]["mode"] == "fallback"
    with PolicyServer(*policy, model_name="tiny", continue_sessions=False) as off:
        reply = post(off, first, "s5", stop=[stop_in(off, first, "s5")])
        nxt = post(off, [*first, reply["choices"][0]["message"], {"role": "user", "content": "Again."}], "s5")
        assert "prompt_continuity" not in nxt
        assert nxt["prompt_token_ids"] == rendered(
            tokenizer, [*first, reply["choices"][0]["message"], {"role": "user", "content": "Again."}]
        )
        assert stats(off) == {"continue_sessions": False}


@pytest.fixture
async def gateway(server: PolicyServer, tmp_path: Path) -> AsyncIterator[Gateway]:
    settings = GatewaySettings.model_validate(
        {
            "listen_port": 0,
            "storage_config": {"db_url": f"sqlite://{tmp_path}/gw.db"},
            "llm_routes": {"tiny": {"base_url": server.base_url, "capture": "tokens"}},
        }
    )
    gw = await serve(settings)
    yield gw
    await gw.stop()


async def test_through_the_gateway_every_step_extends_the_previous(
    server: PolicyServer, gateway: Gateway
) -> None:
    # the gateway sends the session id (X-Session-Id); its record says each step extends the last
    messages: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": "Say hi."}]
    for turn in range(3):
        stop = stop_in(server, messages, "g1")  # a probe straight to the server, in the same session
        r = await gateway.http().post(
            "/v1/sessions/g1/chat/completions",
            json={"model": "tiny", "messages": messages, "max_tokens": 8, "temperature": 0, "stop": [stop]},
        )
        assert r.status_code == 200, r.text
        messages = [
            *messages,
            r.json()["choices"][0]["message"],
            {"role": "user", "content": f"Go on ({turn})."},
        ]
    steps = await gateway.wait_steps("g1", 3)
    assert [s.extends_prefix for s in steps] == [None, True, True]
    assert all(s.finish_reason == "stop" for s in steps)


def test_an_evicted_session_falls_back_and_is_counted(policy: tuple[Any, Any]) -> None:
    tokenizer = policy[1]
    sessions = SessionPrompts(TransformersEngine(*policy), max_sessions=1)
    first = [SYSTEM, {"role": "user", "content": "Say hi."}]
    reply = {"role": "assistant", "content": "Hi."}
    for sid in ("a", "b"):  # b's ids push a's out
        prompt, _ = sessions.prompt(sid, first, None)
        sessions.keep(sid, first, None, prompt, encode(tokenizer, "Hi."), reply)
    later = [*first, reply, {"role": "user", "content": "Again."}]
    ids, how = sessions.prompt("a", later, None)
    assert how.mode == "fallback" and ids == rendered(tokenizer, later)
    assert sessions.stats() == {
        "prompts": {"continued": 0, "rendered": 2, "fallback": 1},
        "sessions": 1,
        "evicted": 1,
        "fallback_reasons": {how.reason: 1},
    }
    assert sessions.prompt("b", later, None)[1] == Continuity("continued")
