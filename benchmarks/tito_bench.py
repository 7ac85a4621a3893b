"""Token in, token out: the share of multi-turn samples that are not one sequence when the policy
server re-renders the chat each turn (before) and when it continues the session's token ids
(after), in one run.

A scripted client plays the bash agent's protocol (its system prompt, a basics task's
instruction, then per turn the reply sent back as is and an observation: a fixed command output
when the reply has one ```bash block, the agent's format error otherwise) against the policy
server's :class:`ChatPolicy` over one engine, each session once per mode with the same seed. A
sample is one sequence when each call's prompt starts with the previous prompt + completion ids
(what the adapters check). The engine is SmolLM2-135M (the embedded model): through llama.cpp
(``--engine llama``, default, fast) or its float32 ``transformers`` model as ``launcher.py train``
serves it (``--engine transformers``, slow to load); ``--engine tiny`` is the byte-level test model.

    PYTHONPATH=. python benchmarks/tito_bench.py [--sessions 16] [--turns 3] [--max-tokens 48] [--quick]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import _bench

from env.bash_agent import SYSTEM_PROMPTS, bash_blocks, format_error
from rollout.train.policy_server import ChatPolicy, ChatRequest
from rollout.train.sampling import Engine

OUTPUT = "<returncode>0</returncode>\n<output>\nnotes.txt  run.sh\n</output>"
MODES = (("re-render (before)", False), ("token in, token out (after)", True))


def engine_of(name: str) -> Engine:
    if name == "llama":
        from rollout.train.embedded import embedded_gguf
        from rollout.train.llama_engine import LlamaCppEngine

        return LlamaCppEngine(embedded_gguf(), n_ctx=4096, name="smollm2")
    from rollout.train.hf_engine import TransformersEngine

    if name == "transformers":
        from rollout.train.embedded import load_embedded_policy

        return TransformersEngine(*load_embedded_policy(), name="smollm2")
    from rollout.train.tiny import tiny_policy

    return TransformersEngine(*tiny_policy(), name="tiny")


def session(policy: ChatPolicy, sid: str, instruction: str, turns: int, args: Any, seed: int) -> list[int]:
    """Run one session; returns for each call after the first whether it extends the last (1/0)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPTS["text"]},
        {"role": "user", "content": instruction},
    ]
    last: list[int] | None = None
    extends = []
    for turn in range(turns):
        req = ChatRequest(
            messages=messages,
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            seed=seed * 1000 + turn,
        )
        prepared = policy.prepare(req, sid)
        gen = policy.run(prepared)
        reply, _ = policy.finish(prepared, gen)
        if last is not None:
            extends.append(int(prepared.prompt_ids[: len(last)] == last))
        last = prepared.prompt_ids + gen.token_ids
        blocks = bash_blocks(reply.get("content"))
        messages = [
            *messages,
            {"role": "assistant", "content": reply.get("content") or ""},
            {"role": "user", "content": OUTPUT if len(blocks) == 1 else format_error(len(blocks))},
        ]
    return extends


def main() -> int:
    ap = _bench.parser(__doc__, quick={"sessions": 3, "turns": 2, "max_tokens": 16})
    ap.add_argument("--sessions", type=int, default=16, help="sessions per mode")
    ap.add_argument("--turns", type=int, default=3, help="model calls per session")
    ap.add_argument("--max-tokens", type=int, default=48, help="completion limit per call")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--engine", choices=["llama", "transformers", "tiny"], default="llama")
    args = ap.parse_args()
    tasks = sorted((_bench.REPO / "env" / "basics" / "tasks").glob("*/instruction.md"))
    if not tasks:
        print("no basics tasks found", file=sys.stderr)
        return 2
    report = _bench.Report("tito_bench", args)
    engine = engine_of(args.engine)
    policies = {on: ChatPolicy(engine, continue_sessions=on) for _, on in MODES}
    results: dict[bool, list[list[int]]] = {on: [] for _, on in MODES}
    seconds = dict.fromkeys(results, 0.0)
    for i in range(args.sessions):
        instruction = Path(tasks[i % len(tasks)]).read_text()
        for _, on in MODES if i % 2 == 0 else MODES[::-1]:  # alternate which mode goes first
            with _bench.timed() as span:
                results[on].append(session(policies[on], f"s{i}", instruction, args.turns, args, seed=i))
            seconds[on] += span.wall_s
    table = _bench.Table(
        f"{args.sessions} sessions x {args.turns} calls per mode ({args.engine}, temperature "
        f"{args.temperature:g}, at most {args.max_tokens} tokens a call)",
        [
            "prompt",
            "samples",
            "not one sequence",
            ("share", ".3f"),
            "calls not extending",
            "fallbacks (counted)",
            ("s per session", ".1f"),
        ],
    )
    for label, on in MODES:
        samples = results[on]
        broken = sum(1 for s in samples if not all(s))
        fallbacks = policies[on].sessions.counts["fallback"] if policies[on].sessions is not None else "-"
        table.add(
            label,
            len(samples),
            broken,
            broken / len(samples) if samples else 0.0,
            sum(len(s) - sum(s) for s in samples),
            fallbacks,
            seconds[on] / max(len(samples), 1),
        )
        report.value(
            f"share_not_one_sequence_{'after' if on else 'before'}", broken / len(samples) if samples else 0.0
        )
    report.table(table)
    report.finish()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
