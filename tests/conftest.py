"""Fixtures shared by every test folder, and the markers of the test tiers (docs/testing.md)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pg_server import PgServer, PgUnavailable

FIXTURE_MARKERS = {"pg_server": "postgres", "ray_cluster": "ray", "browser": "browser", "page": "browser"}
"""A test that takes one of these fixtures gets that marker (the PostgreSQL instance of
``store_url`` gets ``postgres`` too)."""

TIER_MARKERS = ("e2e", "harness", "audit", "train", "postgres", "ray", "browser")
"""A test with any of these markers is also ``slow``: outside ``make test-fast``."""

LISTED: dict[tuple[str, str], tuple[str, ...]] = {
    ("slow", "runs the launcher (a whole job: its gateway, sessions, grading) or several gateways"): (
        "tests/test_unencodable_text.py",
        "tests/train/test_verl_loop.py",
        "tests/test_launcher_regrade.py",
        "tests/test_launcher_job_lock.py",
        "tests/test_harness_e2e.py",
        "tests/rollout/test_attempts.py",
        "tests/rollout/test_attribution.py::test_a_wrong_answer_that_breaks_the_grader_counts_zero_in_the_mean_and_trains",
        "tests/rollout/test_attribution.py::test_a_grader_that_fails_on_its_control_is_broken_named_and_stops_the_job",
        "tests/rollout/test_attribution.py::test_code_under_test_that_stalls_the_verifier_is_the_agents_zero",
        "tests/rollout/test_attribution.py::test_a_tree_too_deep_for_rmtree_is_the_agents_zero_not_a_launcher_error",
        "tests/rollout/test_forged_results.py",
        "tests/rollout/test_one_schema.py",
        "tests/rollout/test_sandbox_bundled.py",
        "tests/feed/test_trainer_loop.py",
        "tests/feed/test_serve.py",
        "tests/feed/test_tokens_feed.py",
        "tests/viewer/test_browser.py",
        "tests/viewer/test_browser_reading.py",
        "tests/gateway/test_many_gateways.py",
        "tests/test_launcher.py::test_launcher_runs_grades_and_reports",
        "tests/test_launcher.py::test_a_job_on_postgresql_stores_the_same_rows_as_on_sqlite",
        "tests/test_launcher.py::test_a_plain_db_path_is_a_sqlite_file",
        "tests/test_launcher.py::test_setup_mistakes_stop_before_running",
        "tests/test_launcher.py::test_case_ids_that_look_like_paths",
        "tests/test_launcher.py::test_gateway_with_auth_running_or_started",
        "tests/test_launcher.py::test_resume_runs_only_unfinished_sessions",
        "tests/test_launcher.py::test_running_gateway_with_other_storage_is_refused",
        "tests/test_launcher.py::test_ctrl_c_cancels_closes_and_leaves_sessions_for_resume",
        "tests/test_launcher.py::test_sigterm_stops_everything",
        "tests/test_launcher.py::test_bad_env_config_is_a_clear_error",
        "tests/test_launcher.py::test_case_timeout_and_tasks_flags_run_exactly_what_they_name",
        "tests/safactory/test_e2e.py",
        "tests/rollout/test_regrade.py::test_cancelled_regrade_leaves_each_session_new_or_previous",
        "tests/rollout/test_regrade.py::test_fixed_grader_regrades_a_real_job_from_the_store_only",
        "tests/env/test_scripts_env.py::test_the_env_runs_in_the_sandbox_and_is_graded_on_the_hidden_answer",
    ),
    ("slow", "starts the project's other programs (python -m gateway, launcher.py view/export/feed)"): (
        "tests/gateway/test_main.py",
        "tests/viewer/test_cli.py",
        "tests/feed/test_export.py",
        "tests/feed/test_client.py::test_iteration_goes_on_across_a_restart_of_the_feed",
        "tests/feed/test_client.py::test_an_unknown_job_is_a_feed_error",
        "tests/rollout/test_cli_damaged_store.py",
    ),
    ("slow", "runs an env's runtime or agent as a subprocess (Python and the OpenAI SDK start each time)"): (
        "tests/env/test_gsm8k_runtime.py",
        "tests/env/test_workspace_runtime.py",
        "tests/env/test_runtime_kit.py::test_run_runtime_reports_an_exception_as_a_failed_result",
        "tests/env/test_runtime_kit.py::test_run_runtime_reports_an_unreadable_request_as_failed",
        "tests/env/test_runtime_kit.py::test_run_runtime_emits_main_result_as_one_line",
        "tests/env/test_bash_agent.py::test_text_protocol_runs_one_block_per_reply_and_submits",
        "tests/env/test_bash_agent.py::test_text_protocol_stops_at_the_step_budget",
        "tests/env/test_bash_agent.py::test_auto_protocol_accepts_tool_calls_and_blocks_and_ends_on_a_plain_reply",
        "tests/env/test_bash_agent.py::test_tools_protocol_ignores_fenced_blocks_and_submit_by_tool_call_finishes",
        "tests/env/test_bash_agent.py::test_api_errors_map_to_exit_codes",
        "tests/env/test_bash_agent.py::test_gateway_stop_is_not_finished",
        "tests/env/test_bash_agent.py::test_usage_errors_exit_64_without_calling_the_model",
    ),
    ("slow", "many sandboxes, or a sandbox run to its timeout"): (
        "tests/rollout/test_sandbox_escape.py",
        "tests/rollout/test_verifier.py::test_the_bundled_bug_fix_checker_holds_against_hostile_code",
        "tests/rollout/test_harbor_tasks.py::test_oracle_scores_10_no_op_and_cheating_agents_0",
        "tests/rollout/test_harbor_tasks.py::test_a_verifier_timeout_is_a_grading_failure_and_an_evaluator_gets_the_verdict",
        "tests/rollout/test_grading_sandbox.py::test_a_model_answer_linking_the_expected_answer_through_the_bash_tool_scores_0",
    ),
    ("slow", "builds container images (mmdebstrap, buildah) and runs sessions in them"): (
        "tests/rollout/test_images.py::test_a_build_that_fails_fails_with_its_log_tail_and_is_not_built_again",
        "tests/rollout/test_images.py::test_a_task_with_a_dockerfile_runs_in_its_image",
        "tests/rollout/test_images.py::test_a_task_whose_image_does_not_build_fails_as_setup_and_the_job_goes_on",
        "tests/rollout/test_images.py::test_the_audit_runs_an_image_task_with_the_image_map",
        "tests/rollout/test_images.py::test_a_base_rebuilt_under_the_same_tag_builds_the_task_again",
        "tests/rollout/test_images.py::test_same_container_verifies_on_the_agents_layer_and_every_record_says_so",
        "tests/rollout/test_images.py::test_a_dockerfile_tasks_build_context_is_not_copied_over_its_workdir",
    ),
    (
        "slow",
        "drives real eval clients through the gateway (inspect_ai, verifiers: seconds to import and run)",
    ): ("tests/gateway/test_one_base_url_clients.py",),
    ("slow", "imports every module the docs name (rollout.train.sync loads torch and transformers)"): (
        "tests/house/test_docs_names.py::test_every_code_name_quoted_in_the_docs_resolves",
    ),
    ("slow", "trains a model with TRL (torch and transformers load)"): (
        "tests/train/test_adapters.py::test_trls_grpo_trainer_trains_on_the_rollout_output",
    ),
    ("e2e", "starts the local model's server (llama.cpp, the embedded model)"): (
        "tests/gateway/test_count_tokens_llama.py",
    ),
    ("postgres", "starts PostgreSQL servers of its own"): ("tests/test_pg_server.py",),
    ("browser", "a launcher job watched in Chromium (playwright's async API, no fixture)"): (
        "tests/viewer/test_live.py",
    ),
    ("ray", "imports Ray"): (
        "tests/rollout/test_ray_mode.py::test_a_ray_address_where_nothing_listens_is_a_clear_error",
        "tests/rollout/test_ray_mode.py::test_a_job_on_an_unreachable_ray_cluster_writes_no_row",
    ),
}
"""Tests marked for what they run, by (marker, reason): a test module, or a test function (all
its parameters). A listed name that matches no test of a collected module is an error."""


def _markers(item: pytest.Item, function: str, module: str) -> set[str]:
    found = {FIXTURE_MARKERS[f] for f in getattr(item, "fixturenames", ()) if f in FIXTURE_MARKERS}
    callspec = getattr(item, "callspec", None)
    if callspec is not None and callspec.params.get("store_url") == "postgresql":
        found.add("postgres")
    found |= {marker for (marker, _), names in LISTED.items() if function in names or module in names}
    return found


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks the tests of the slow tiers (:data:`FIXTURE_MARKERS`, :data:`LISTED`); every test of
    a tier in :data:`TIER_MARKERS` is ``slow`` too."""
    modules: dict[str, object] = {}
    for item in items:
        module = item.nodeid.split("::")[0]
        function = item.nodeid.split("[")[0]
        modules[module] = getattr(item, "module", None)
        for marker in _markers(item, function, module):
            item.add_marker(marker)
        if any(item.get_closest_marker(m) for m in TIER_MARKERS):
            item.add_marker("slow")
    listed = {name for names in LISTED.values() for name in names}
    stale = sorted(
        n
        for n in listed
        if not (config.rootpath / n.split("::")[0]).is_file()
        or (
            "::" in n
            and n.split("::")[0] in modules
            and not hasattr(modules[n.split("::")[0]], n.split("::")[1])
        )
    )
    if stale:
        raise pytest.UsageError(f"tests/conftest.py lists tests that do not exist: {', '.join(stale)}")


@pytest.fixture(scope="session")
def public_data() -> Path:
    """The folder of real public data sets some tests read (``gsm8k/test.jsonl``,
    ``loghub/OpenSSH_2k.log``), named by ``$ROLLOUT_TEST_DATA``; never copied into the repo.
    Unset: those tests are skipped, except under CI (``CI=true``), where that is an error."""
    value = os.environ.get("ROLLOUT_TEST_DATA")
    if not value:
        if os.environ.get("CI") == "true":
            pytest.fail("ROLLOUT_TEST_DATA is not set: CI must point it at the public data folder")
        pytest.skip("ROLLOUT_TEST_DATA is not set (a folder holding gsm8k/test.jsonl)")
    path = Path(value).expanduser().resolve()
    if not path.is_dir():
        pytest.fail(f"ROLLOUT_TEST_DATA={value} is not a folder")
    return path


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """A PostgreSQL server for this test session (:mod:`tests.pg_server`), stopped at the end.
    None can be started (not installed, no ``postgres`` user): the tests that need it are
    skipped, except under CI (``CI=true``), where that is an error."""
    server = PgServer()
    try:
        server.start()
    except PgUnavailable as e:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI needs a PostgreSQL server: {e}")
        pytest.skip(f"no PostgreSQL server for the PostgreSQL half of the store tests: {e}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A storage URL of an empty store, once per backend: a SQLite file in ``tmp_path``, and a
    fresh database on :func:`pg_server` (dropped afterwards)."""
    if request.param == "sqlite":
        yield f"sqlite://{tmp_path}/store.db"
        return
    server: PgServer = request.getfixturevalue("pg_server")
    url = server.create_database()
    try:
        yield url
    finally:
        server.drop_database(url)
