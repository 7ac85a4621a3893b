"""What an evaluator is handed: ``request``, ``spec`` and ``trajectory`` as ``Record`` views.

A ``Record`` is a ``dict`` whose keys also read as attributes (``request.env_params`` and
``request["env_params"]``; ``trajectory.steps[-1].content`` and ``...["content"]``), with
``model_dump()`` / ``model_dump_json()`` for code written against the pydantic models of
``rollout.contract.protocol``. The same views are handed in the grader sandbox and in-process, built from
the models' JSON form. Stdlib only: the grader sandbox imports it.
"""

from __future__ import annotations

import json
from typing import Any


class Record(dict[str, Any]):
    """A mapping whose keys read as attributes too (a missing one raises AttributeError)."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def model_dump(self, **_: Any) -> dict[str, Any]:
        """A deep plain copy (JSON types only), as pydantic's ``model_dump`` gives."""
        return json.loads(json.dumps(self))  # type: ignore[no-any-return]

    def model_dump_json(self, **_: Any) -> str:
        """The JSON text of this record."""
        return json.dumps(self)


def request_view(data: dict[str, Any]) -> Record:
    """An ``EvalRequest`` in JSON form as a Record (``start_result`` a Record too, or None)."""
    out = Record(data)
    if isinstance(out.get("start_result"), dict):
        out["start_result"] = Record(out["start_result"])
    return out


SAFACTORY_STEP_ALIASES = {"llm_model": "model"}
"""Keys of Safactory's step rows an evaluator may read, as the name of the same field here."""


def trajectory_view(data: dict[str, Any]) -> Record:
    """A ``Trajectory`` in JSON form as a Record whose ``steps`` are Records; each step also
    carries the session id and Safactory's names of its fields (``SAFACTORY_STEP_ALIASES``)."""
    out = Record(data)
    out["steps"] = [Record(s) for s in out.get("steps") or []]
    for step in out["steps"]:
        step.setdefault("session_id", out.get("session_id"))
        for alias, name in SAFACTORY_STEP_ALIASES.items():
            if name in step:
                step.setdefault(alias, step[name])
    return out
