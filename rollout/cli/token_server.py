"""``python -m rollout.cli.token_server --model FILE.gguf --port N``: a llama.cpp model behind the
policy server's OpenAI-compatible front (rollout.train.policy_server), so every answer can carry
vLLM's exact token ids and logprobs. The launcher starts it for a route with ``managed.kind:
llama_cpp_tokens`` (docs/training.md, "The policy server")."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from rollout.cli.verbs import run_command
from rollout.core.argtypes import int_at_least
from rollout.servers.listener import listen, run_server
from rollout.train.llama_engine import LlamaCppEngine
from rollout.train.policy_server import ChatPolicy, create_app
from rollout.train.sampling import SamplingParams


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m rollout.cli.token_server", description=__doc__
    )
    ap.add_argument("--model", type=Path, required=True, help="the GGUF file")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8081)
    ap.add_argument("--n-ctx", type=int_at_least(16), default=4096, help="context size in tokens")
    ap.add_argument(
        "--n-threads", type=int_at_least(1), default=None, help="llama.cpp threads (default: its own)"
    )
    ap.add_argument("--name", default="local", help="the model name /v1/models lists")
    # a request that sets none of these gets llama-cpp-python's server defaults (min_p aside)
    ap.add_argument("--temperature", type=float, default=0.8, help="default temperature (default 0.8)")
    ap.add_argument("--top-p", type=float, default=0.95, help="default top_p (default 0.95)")
    ap.add_argument("--top-k", type=int_at_least(0), default=40, help="default top_k, 0: off (default 40)")
    ap.add_argument(
        "--seed",
        type=int,
        default=0,
        help="requests without a seed draw one from a stream seeded "
        "with this, in arrival order, so a repeated run samples alike (-1: fresh randomness)",
    )
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    async def start() -> None:
        sock = listen(args.host, args.port, exposes="the model")
        engine = LlamaCppEngine(args.model, n_ctx=args.n_ctx, n_threads=args.n_threads, name=args.name)
        defaults = SamplingParams(
            max_new_tokens=0, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k
        )
        policy = ChatPolicy(engine, defaults=defaults, seed=None if args.seed < 0 else args.seed)
        await run_server(create_app(policy), sock, args.host)

    return run_command(start, args.host, args.port, (ValueError,))


if __name__ == "__main__":
    raise SystemExit(main())
