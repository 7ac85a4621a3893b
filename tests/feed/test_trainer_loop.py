"""The example trainer against a job in progress: the real launcher (gateway, runtimes,
evaluator) with the fake upstream as the model, the feed service as a subprocess, the trainer
killed while the job still runs and restarted: every group is seen exactly once, in ready order;
its errors (unknown job, bad state file, bad flags) are one line and a nonzero exit."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import yaml

from store import Store
from tests.fake_upstream import DEFAULT_TEXT, FakeRequest, FakeUpstream, Reply, chat_completion
from tests.feed.helpers import CASES, ENV, REPO, make_env


async def spawn(*args: str, cwd: Path, stdout: Path | None = None) -> asyncio.subprocess.Process:
    out = stdout.open("wb") if stdout else asyncio.subprocess.PIPE
    try:
        return await asyncio.create_subprocess_exec(
            sys.executable, *args, cwd=str(cwd), env=ENV, stdout=out, stderr=asyncio.subprocess.PIPE
        )
    finally:
        if stdout:
            out.close()  # type: ignore[union-attr]


async def until(pred: Callable[[], bool], what: str, timeout: float = 180.0) -> None:
    try:
        async with asyncio.timeout(timeout):
            while not pred():
                await asyncio.sleep(0.1)
    except TimeoutError:
        raise AssertionError(f"not within {timeout} s: {what}") from None


def state_cursor(path: Path) -> int:
    try:
        return int(json.loads(path.read_text())["cursor"])
    except (FileNotFoundError, ValueError):
        return 0


async def test_trainer_reads_a_running_job_survives_a_restart_and_sees_each_group_once(
    tmp_path: Path,
) -> None:
    make_env(tmp_path / "envs")
    db = tmp_path / "trajs.db"
    release = asyncio.Event()
    served = 0

    async def gated(req: FakeRequest) -> Reply:
        nonlocal served
        served += 1
        if served > 4:  # cases a and b (2 samples each, one session at a time) answer at once
            await release.wait()
        return Reply.json(chat_completion(DEFAULT_TEXT))

    async with FakeUpstream() as up:
        up.script("/v1/chat/completions", [gated] * (2 * len(CASES)))
        cfg = tmp_path / "gw.yaml"
        cfg.write_text(
            yaml.safe_dump(
                {
                    "storage_config": {"db_url": f"sqlite://{db}"},
                    "llm_routes": {"fake": {"base_url": up.base_url}},
                }
            )
        )
        launcher = await spawn(
            str(REPO / "launcher.py"),
            "--agent-root",
            str(tmp_path / "envs"),
            "--gateway-config",
            str(cfg),
            "--llm-model",
            "fake",
            "--db-path",
            f"sqlite://{db}",
            "--enable-evaluation",
            "--pool-size",
            "1",
            "--rl-group-size",
            "2",
            "--job-id",
            "job1",
            "--no-progress",
            "--out",
            str(tmp_path / "out.jsonl"),
            cwd=tmp_path,
        )
        feed = None
        trainer = None
        try:
            await up.wait_for_requests(1, timeout=180)  # the job's rows are in the store
            feed = await spawn(
                str(REPO / "launcher.py"),
                "feed",
                "--db-path",
                f"sqlite://{db}",
                "--port",
                "0",
                "--poll-interval-s",
                "0.05",
                cwd=tmp_path,
            )
            assert feed.stdout is not None
            first = (await asyncio.wait_for(feed.stdout.readline(), 120)).decode()
            url = first.split()[2].rstrip("/")
            assert first.startswith("feed on http://127.0.0.1:"), first

            state = tmp_path / "trainer.json"
            argv = [
                str(REPO / "examples" / "trainer_loop.py"),
                "--feed-url",
                url,
                "--job-id",
                "job1",
                "--state",
                str(state),
                "--wait-s",
                "2",
            ]
            trainer = await spawn(*argv, cwd=tmp_path, stdout=tmp_path / "run1.out")
            await until(lambda: state_cursor(state) >= 2, "the trainer accounted for two groups")
            # the job is still running (the model holds the later sessions): kill the trainer mid-job
            async with httpx.AsyncClient(timeout=30) as http:
                progress = (await http.get(f"{url}/v1/jobs/job1")).json()
            assert progress["groups_ready"] == 2 and not progress["done"] and launcher.returncode is None
            trainer.send_signal(signal.SIGKILL)
            await trainer.wait()
            assert state_cursor(state) == 2

            release.set()
            trainer = await spawn(*argv, cwd=tmp_path, stdout=tmp_path / "run2.out")
            assert await asyncio.wait_for(trainer.wait(), 300) == 0
            code = await asyncio.wait_for(launcher.wait(), 300)
            # case d's evaluator raises on its second sample whatever the agent did (on the control too):
            # a broken grader, the job's last session: exit 5
            assert code == 5
        finally:
            for p in (trainer, feed, launcher):
                if p is not None and p.returncode is None:
                    p.send_signal(signal.SIGTERM)
                    await p.wait()

    run1 = [json.loads(x) for x in (tmp_path / "run1.out").read_text().splitlines()]
    run2 = [json.loads(x) for x in (tmp_path / "run2.out").read_text().splitlines()]
    assert run1[0] == {"event": "start", "job_id": "job1", "after": 0}
    assert run2[0] == {"event": "start", "job_id": "job1", "after": 2}
    groups = [x for x in run1 + run2 if "group_id" in x]
    assert [g["cursor"] for g in groups] == [1, 2, 3, 4]  # each group once, in ready order
    assert [g["case_id"] for g in groups] == CASES  # one session at a time: groups finish in case order
    assert len({g["group_id"] for g in groups}) == 4
    for g in groups[:3]:
        assert g["trainable"] and g["mean_score"] == 5.0
        assert [round(s["advantage"], 5) for s in g["samples"]] == [1.0, -1.0]
        assert [s["score"] for s in g["samples"]] == [10.0, 0.0]
        # the fake upstream returns no token ids or logprobs: the loss input is unknown, never 0
        assert [s["logprob_sum"] for s in g["samples"]] == [None, None] and g["loss"] is None
    d = groups[3]
    assert (d["trainable"], d["flags"]) == (False, ["too_few_valid"])
    assert d["samples"][1]["valid"] is False and d["samples"][1]["score"] is None
    assert d["samples"][1]["invalid_reason"].startswith("evaluation grader_broken: grader broken")
    assert run2[-1]["event"] == "done" and run2[-1]["groups"] == 4 and run2[-1]["cursor"] == 4


def test_trainer_errors_are_one_line_and_a_nonzero_exit(tmp_path: Path) -> None:
    db = tmp_path / "t.db"

    async def empty_store() -> None:
        store = Store(f"sqlite://{db}")
        await store.init()
        await store.close()

    asyncio.run(empty_store())
    feed = subprocess.Popen(
        [sys.executable, str(REPO / "launcher.py"), "feed", "--db-path", f"sqlite://{db}", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    try:
        assert feed.stdout is not None
        url = feed.stdout.readline().split()[2].rstrip("/")

        def trainer(*args: str) -> tuple[int, str]:
            r = subprocess.run(
                [
                    sys.executable,
                    str(REPO / "examples" / "trainer_loop.py"),
                    "--feed-url",
                    url,
                    "--job-id",
                    "nope",
                    *args,
                ],
                capture_output=True,
                text=True,
                timeout=120,
                env=ENV,
                cwd=tmp_path,
            )
            assert "Traceback" not in r.stderr, r.stderr
            return r.returncode, r.stderr.strip().splitlines()[-1]

        state = tmp_path / "state.json"
        assert trainer("--state", str(state)) == (
            1,
            "error: GET /v1/jobs/nope/groups: HTTP 404 unknown_job: no job 'nope' in this store",
        )
        assert not state.exists()
        folder = tmp_path / "folder"
        folder.mkdir()
        assert trainer("--state", str(folder)) == (
            1,
            f"error: --state {folder} is a folder; give a file path",
        )
        state.write_text('{"cursor": "x"}')
        assert trainer("--state", str(state)) == (
            1,
            f"error: --state {state} does not hold a trainer state (a JSON object with cursor, groups, updates, "
            "loss_sum)",
        )
        state.write_text("{not json")
        code, line = trainer("--state", str(state))
        assert code == 1 and line.startswith(f"error: cannot read --state {state}: Expecting property name")
        assert trainer("--state", str(state), "--min-valid", "-1") == (
            2,
            "trainer_loop.py: error: argument --min-valid: -1 is below 1 (it must be at least 1)",
        )
        assert trainer("--state", str(state), "--wait-s", "nan") == (
            2,
            "trainer_loop.py: error: argument --wait-s: 'nan' is not a finite number",
        )
    finally:
        feed.kill()
        feed.wait()
        if feed.stdout is not None:
            feed.stdout.close()
