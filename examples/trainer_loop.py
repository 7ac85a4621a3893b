"""A trainer loop on the feed, without a deep-learning framework: it reads a job's ready groups
while the job runs, computes a policy-gradient loss input per group and prints it as one JSON
line. Run the feed first (``python launcher.py feed``), then:

    python examples/trainer_loop.py --feed-url http://127.0.0.1:8766 --job-id JOB --state runs/trainer.json

The loss input of a valid sample i is ``-A_i * sum(logprobs of its model tokens)`` (REINFORCE
with GRPO's group-relative advantage A_i; on-policy, so no importance ratio). Its gradient is what
a real trainer would backpropagate. The cursor is saved in ``--state`` together with the running
totals, in one atomic write after each group: killed at any point, the loop resumes after the last
group it accounted for, so every group is counted exactly once (a line printed just before a kill
may be printed again; its totals are not).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from rollout.client import FeedClient, FeedError
from rollout.core.argtypes import finite_float, int_at_least
from rollout.results.feed_schema import FeedGroupOut, FeedSample


class StateError(ValueError):
    """The state file cannot be read or does not hold a trainer state."""


STATE_KEYS = {"cursor": (int,), "groups": (int,), "updates": (int,), "loss_sum": (int, float)}


def load_state(path: Path) -> dict[str, Any]:
    """The trainer's state: the feed cursor and running totals (fresh when the file is absent).
    StateError for a path that is a folder, an unreadable file or one without a state."""
    if not path.exists():
        return {"cursor": 0, "groups": 0, "updates": 0, "loss_sum": 0.0}
    if path.is_dir():
        raise StateError(f"--state {path} is a folder; give a file path")
    try:
        state = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise StateError(f"cannot read --state {path}: {e}") from None
    if not isinstance(state, dict) or any(
        isinstance(state.get(k), bool) or not isinstance(state.get(k), types)
        for k, types in STATE_KEYS.items()
    ):
        raise StateError(
            f"--state {path} does not hold a trainer state (a JSON object with {', '.join(STATE_KEYS)})"
        )
    return dict(state)


def save_state(path: Path, state: dict[str, Any]) -> None:
    """Replace the state file atomically (temporary file, fsync, rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    with os.fdopen(fd, "w") as f:
        json.dump(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def sample_loss(s: FeedSample) -> dict[str, Any]:
    """The loss input of one sample: its model tokens (mask 1), their logprob sum (None when the
    route did not capture logprobs) and ``-advantage * logprob_sum``."""
    model_lp = [lp for seq in s.sequences or [] for lp, m in zip(seq.logprobs, seq.mask, strict=True) if m]
    known = bool(model_lp) and all(lp is not None for lp in model_lp)
    lp_sum = sum(lp for lp in model_lp if lp is not None) if known else None
    loss = -s.advantage * lp_sum if (s.advantage is not None and lp_sum is not None) else None
    return {
        "session_id": s.session_id,
        "score": s.score,
        "valid": s.valid,
        "invalid_reason": s.invalid_reason,
        "advantage": s.advantage,
        "model_tokens": len(model_lp),
        "logprob_sum": lp_sum,
        "loss_term": loss,
    }


def group_loss(g: FeedGroupOut) -> dict[str, Any]:
    """One printed line: the group, its samples' loss inputs and the group's mean loss input
    (over valid samples with known logprobs; None when there is none, or the group is flagged)."""
    samples = [sample_loss(s) for s in g.samples]
    terms = [x["loss_term"] for x in samples if x["valid"] and x["loss_term"] is not None]
    return {
        "cursor": g.cursor,
        "group_id": g.group_id,
        "env": g.env,
        "case_id": g.case_id,
        "model": g.model,
        "trainable": g.trainable,
        "flags": g.flags,
        "mean_score": g.mean_score,
        "samples": samples,
        "loss": (sum(terms) / len(terms)) if (g.trainable and terms) else None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--feed-url", required=True, help="the feed service, e.g. http://127.0.0.1:8766")
    ap.add_argument("--job-id", required=True)
    ap.add_argument("--state", type=Path, required=True, help="trainer state file (cursor + totals)")
    ap.add_argument(
        "--min-valid", type=int_at_least(1), help="valid samples a group needs (default: the feed's)"
    )
    ap.add_argument(
        "--wait-s", type=finite_float(low=0), default=30.0, help="long-poll wait per request (default 30)"
    )
    args = ap.parse_args(argv)
    try:
        return run(args)
    except (StateError, FeedError) as e:  # FeedUnavailable too: the feed could not be reached
        print(f"error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"error: cannot write --state {args.state}: {e}", file=sys.stderr)
        return 1


def run(args: argparse.Namespace) -> int:
    """The loop: read groups from the saved cursor, print each one's loss input, save the state."""
    state = load_state(args.state)
    print(json.dumps({"event": "start", "job_id": args.job_id, "after": state["cursor"]}), flush=True)
    with FeedClient(args.feed_url) as client:
        for group in client.groups(
            args.job_id, after=state["cursor"], wait_s=args.wait_s, min_valid=args.min_valid, view="tokens"
        ):
            line = group_loss(group)
            print(json.dumps(line), flush=True)
            state["cursor"] = group.cursor
            state["groups"] += 1
            if line["loss"] is not None:  # an optimizer step would go here
                state["updates"] += 1
                state["loss_sum"] += line["loss"]
            save_state(args.state, state)
    print(json.dumps({"event": "done", **state}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
