"""Runs one evaluation inside the grader sandbox (started by ``rollout.grading.sandbox``).

First makes itself non-dumpable (``prctl(PR_SET_DUMPABLE, 0)``): a process the evaluator starts
(same uid) can then neither open its ``/proc/<pid>/fd``, ``mem`` or ``environ`` nor trace it. Reads
``{"evaluator", "request", "spec", "trajectory", "rlimits", "result_fd", "nonce"}`` as JSON on
stdin, closes stdin, keeps the result pipe from every program it starts (close-on-exec), sets the
resource limits, points its own stdout at stderr (what the evaluator prints is log, never the
result), loads the evaluator, calls ``evaluate(request, spec, trajectory)`` with ``Record`` views (by keyword
when it takes them by name: ``evaluator_loader.call_arguments``),
applies the score rule and writes the nonce (never handed to the evaluator), a newline and one JSON
object to the pipe ``result_fd``: ``status`` (``scored`` |
``invalid_reward`` | ``error``), ``score``, ``raw_repr``, ``reason``, ``artifacts``, ``score_keys``.
Stdlib only.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import sys
from collections.abc import Awaitable
from typing import Any

from rollout.grading import evaluator_loader, scoring
from rollout.grading.views import Record, request_view, trajectory_view

_PR_SET_DUMPABLE = 4
_RLIMITS = {
    "as": resource.RLIMIT_AS,
    "cpu": resource.RLIMIT_CPU,
    "fsize": resource.RLIMIT_FSIZE,
    "core": resource.RLIMIT_CORE,
    "nofile": resource.RLIMIT_NOFILE,
}


def _json_safe(value: Any) -> Any:
    """``value`` as JSON types: anything else becomes its (cut) repr."""
    try:
        return json.loads(json.dumps(value, default=lambda v: scoring.cut_text(repr(v)), allow_nan=False))
    except (ValueError, TypeError, RecursionError):
        return scoring.cut_text(repr(value))


def _evaluate(job: dict[str, Any]) -> dict[str, Any]:
    try:
        fn = evaluator_loader.load_evaluator(job["evaluator"])
    except evaluator_loader.EvaluatorLoadError as e:
        return {"status": "error", "score": 0.0, "reason": f"EvaluatorLoadError: {e}"}
    try:
        args, kwargs = evaluator_loader.call_arguments(
            fn, request_view(job["request"]), Record(job["spec"]), trajectory_view(job["trajectory"])
        )
        value = fn(*args, **kwargs)
        if isinstance(value, Awaitable):
            value = _run(value)
    except (Exception, SystemExit) as e:
        return {"status": "error", "score": 0.0, "reason": scoring.cut_text(f"{type(e).__name__}: {e}")}
    check = scoring.normalize_score(value)
    return {
        "status": check.status,
        "score": check.score if check.status == "scored" else 0.0,
        "raw_repr": check.raw_repr,
        "reason": check.reason,
        "artifacts": _json_safe(check.artifacts) if check.artifacts is not None else None,
        "score_keys": list(check.keys),
    }


async def _wait(awaitable: Any) -> Any:
    return await awaitable


def _run(awaitable: Any) -> Any:
    import asyncio  # only for an async evaluator: it costs a sandbox start ~10 ms  # noqa: PLC0415

    return asyncio.run(_wait(awaitable))


def _undumpable() -> None:
    """``prctl(PR_SET_DUMPABLE, 0)``; raises OSError when it fails (then there is no result: an error)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_DUMPABLE, 0): {os.strerror(err)}")


def main() -> None:
    """The child's whole life: not dumpable, limits, the evaluation, one framed result on the result pipe."""
    _undumpable()
    job = json.loads(sys.stdin.buffer.read())
    nonce = str(job.pop("nonce"))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    fd = int(job["result_fd"])
    os.set_inheritable(fd, False)
    result = os.fdopen(fd, "w", encoding="utf-8")
    for name, value in (job.get("rlimits") or {}).items():
        resource.setrlimit(_RLIMITS[name], (int(value), int(value)))
    os.dup2(2, 1)  # prints go to the log
    out = _evaluate(job)
    result.write(nonce + "\n" + json.dumps(out, ensure_ascii=True))
    result.close()


if __name__ == "__main__":
    main()
