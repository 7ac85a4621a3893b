"""Every name of the code quoted in docs/*.md and README.md resolves, and its quoted signature is
the real one (the rule: tests/house/doc_names.py, docs/testing.md)."""

from __future__ import annotations

import pytest

from tests.house import doc_names
from tests.house.doc_names import ROOT, Checker, Report, build_index, check_markdown


@pytest.fixture(scope="module")
def checker() -> Checker:
    return Checker(build_index())


def _check(checker: Checker, text: str) -> Report:
    report = Report()
    checker.check(text, "snippet.md", report)
    return report


def test_every_code_name_quoted_in_the_docs_resolves() -> None:
    report = check_markdown([*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"])
    print("skipped (a third-party package missing here):", *report.skipped, sep="\n  ")
    assert report.problems == [], "stale names in the docs:\n" + "\n".join(report.problems)
    assert len(report.checked) > 350, report.checked  # 391 when written: the rules still see the docs
    assert all(": needs '" in s and "', not installed" in s for s in report.skipped), report.skipped


@pytest.mark.parametrize(
    ("snippet", "why"),
    [
        ("`rollout.core.outcomes.no_such_name`", "no attribute 'no_such_name'"),
        ("`rollout.core.no_such_module.classify`", "no attribute 'no_such_module'"),
        ("`store.Store.no_such_method`", "no attribute 'no_such_method'"),
        ("`Store.trajectories`", "no attribute 'trajectories'"),
        ("`Call.finish(outcome)`", "no parameter 'outcome'"),
        ("`gateway.call.Call.finish(end: str)`", "end is 'CallEnd', not 'str'"),
        ("`Call.finish(end) -> bool`", "returns 'None', not 'bool'"),
        ("`Call.finish(end, now)`", "2 positional arguments"),
        ("`Dropped(group_id, reason, session_id)`", "'reason' is not the argument number 2"),
        ("`Dropped(group_id, session_id)`", "leaves out ['reason']"),
        ("`Plan.write_answer(answer, token=...)`", "no parameter 'token'"),
        ("`store.Store(db_url).trajectory(session_id)`", "no parameter 'db_url'"),
        (
            "`SimulationStartRequest.metadata.attempt.x` and `SimulationStartRequest.meta`",
            "no attribute 'meta'",
        ),
        ("`rollout/jobs/no_such_module.py`", "does not exist"),
        ("`python -m rollout.cli.no_such_cli --flag`", "no module rollout.cli.no_such_cli"),
        ("`_Strict.model_config`", "name its module nearby"),
        ("`store.engine.SQLITE_PAGE_SIZE(n)`", "SQLITE_PAGE_SIZE is not callable"),
        ("`UpstreamFailed.no_such_field`", "no attribute 'no_such_field'"),
        ("`UpstreamFailed(status, step_status, error, phase, retry_after)`", "no parameter 'retry_after'"),
        ("`job_environments.rewards`", "no column 'rewards' in table job_environments"),
        ("`runtime.timeout`", "no key runtime.timeout in EnvConfig"),
        ("`llm_routes.m.base`", "no key llm_routes.m.base in GatewaySettings"),
        ("`tests.no_such_helper`", "no attribute 'no_such_helper'"),
        (
            "`discover_evaluator(root, env_name)` in `rollout/grading/evaluator_loader.py`",
            "no parameter 'root'",
        ),
    ],
)
def test_a_stale_name_fails(checker: Checker, snippet: str, why: str) -> None:
    report = _check(checker, f"Some text with {snippet} in it.\n")
    assert len(report.problems) == 1, report
    assert why in report.problems[0]


@pytest.mark.parametrize(
    "snippet",
    [
        "`rollout.core.outcomes.classify`",
        "`store.Store.trajectory`",
        "`Store.trajectory` and ``Reply.json``",
        "`Call.finish(end)`, `Call.finish(end: CallEnd) -> None`, `Call.abandon()`",
        "`Dropped(group_id, session_id, reason)`, `PolicyServer(..., seed=N)`",
        "`Plan.write_answer(answer, submit=True)`, `Plan.write_answer(answer, ...)`",
        "`store.Store(url).trajectory(session_id)`",
        "`SimulationStartRequest.metadata.attempt`",
        "`UpstreamFailed.retry_reason`, `UpstreamFailed.retry_reason(anything)`, `HarnessUnavailable(reason)`",
        "`rollout/core/outcomes.py`, `rollout/jobs/`, `python -m gateway --config configs/gateway.yaml`",
        "`_Strict.model_config` (`gateway/settings.py`)",
        "`job_environments.result.metrics.harness_exit`, `session_steps.reward`",
        "`runtime.limits`, `dataset.hidden_fields`, `params.temperature`, `llm_routes.m.base_url`, `auth.api_keys`",
        "`tests.fake_upstream.Plan.write_answer(answer, ...)`",
        "`discover_evaluator(agent_root, env_name)` in `rollout/grading/evaluator_loader.py`",
    ],
)
def test_a_true_name_passes_and_is_checked(checker: Checker, snippet: str) -> None:
    report = _check(checker, f"Some text with {snippet} in it.\n")
    assert report.problems == []
    assert len(report.checked) == snippet.count("`") // 2 - snippet.count("``") // 2


@pytest.mark.parametrize(
    "snippet",
    [
        "`env.yaml`",
        "`harness.py`",
        "`ROLLOUT_TEST_DATA`",
        "`pytest -q -k name`",
        '`"stream": true`',
        "`tests/test.sh`",
        "`env/case`",
        "`env/<name>/rule_evaluator.py`",
        "`container.image`",
        "`meta_json.attempts`",
        "`request.workspace`",
        "`launch(ctx) -> HarnessLaunch`",
        "`workspace_copy.stripped`",
        "`OpenAI(base_url=u)`",
        "`discover_evaluator(root, name)` with its module named in another paragraph",
    ],
)
def test_what_is_not_a_reference_to_the_code_is_not_checked(checker: Checker, snippet: str) -> None:
    report = _check(checker, f"`rollout/grading/workspace_copy.py`\n\nSome text with {snippet} in it.\n")
    assert report.problems == []
    assert report.checked == ["snippet.md: `rollout/grading/workspace_copy.py`"]


TABLE = """| # | file | read | what |
|---|---|---|---|
| 1 | `store/launcher_rows.py` | `LauncherRows.finish_job_session`, `write_evaluation` | the end |
| 2 | `gateway/call.py` | `Call.finish`, `finish` | a call |
| 3 | `gateway/no_such_module.py` | `Call` | gone |
"""


def test_a_name_read_in_a_file_of_a_table_is_in_that_file(checker: Checker) -> None:
    report = _check(checker, TABLE)
    assert report.problems == [
        "snippet.md: `gateway/no_such_module.py`: gateway/no_such_module.py does not exist",
        "snippet.md: `gateway/call.py: finish`: finish: no attribute 'finish' on 'gateway.call'",
        "snippet.md: `gateway/no_such_module.py: Call`: gateway/no_such_module.py does not exist",
    ]
    assert [c for c in report.checked if ": " in c.split("`")[1]] == [
        "snippet.md: `store/launcher_rows.py: LauncherRows.finish_job_session`",
        "snippet.md: `store/launcher_rows.py: write_evaluation`",
        "snippet.md: `gateway/call.py: Call.finish`",
    ]


def test_a_table_without_file_and_read_columns_is_not_read_that_way(checker: Checker) -> None:
    table = "| table | code |\n|---|---|\n| `job_environments` | `store/launcher_rows.py` |\n"
    assert _check(checker, table) == Report(checked=["snippet.md: `store/launcher_rows.py`"])


def test_a_fenced_block_is_not_checked(checker: Checker) -> None:
    assert _check(checker, "```python\nx = `rollout.core.nothing`\n```\n`rollout.core.nope`\n").problems == [
        "snippet.md: `rollout.core.nope`: rollout.core.nope: no attribute 'nope' on 'rollout.core'"
    ]


def test_a_planted_stale_name_in_a_real_page_fails() -> None:
    page = (ROOT / "docs" / "storage.md").read_text(encoding="utf-8")
    assert "`Store.trajectory`" in page
    report = Report()
    Checker(build_index()).check(
        page.replace("`Store.trajectory`", "`Store.trajectories`", 1), "storage.md", report
    )
    assert [p.split(":", 2)[1] for p in report.problems] == [" `Store.trajectories`"]


def test_a_missing_third_party_package_skips_that_name_only(
    monkeypatch: pytest.MonkeyPatch, checker: Checker
) -> None:
    real = doc_names.importlib.import_module

    def import_module(name: str) -> object:
        if name == "rollout.train.sync":
            raise ModuleNotFoundError("No module named 'torch'", name="torch")
        if name == "rollout.train.adapters":
            raise ModuleNotFoundError("No module named 'rollout.train.gone'", name="rollout.train.gone")
        return real(name)

    monkeypatch.setattr(doc_names.importlib, "import_module", import_module)
    report = _check(
        checker,
        "`rollout.train.sync.set_policy_version`, `rollout.train.adapters.Dropped`, "
        "`rollout.core.outcomes.nope`",
    )
    assert report.skipped == [
        "snippet.md: `rollout.train.sync.set_policy_version`: rollout.train.sync needs 'torch', not installed"
    ]
    assert [p.split(":", 2)[1] for p in report.problems] == [
        " `rollout.train.adapters.Dropped`",
        " `rollout.core.outcomes.nope`",
    ]
