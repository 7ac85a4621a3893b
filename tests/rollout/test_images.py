"""Tasks in their own container images (docs/images.md): the bundled Harbor task with a Dockerfile
(``examples/harbor_image``) built with buildah FROM a base made of Debian packages
(``scripts/build_base_images.sh``), run through the real launcher: the oracle scores 10 in the
image, an agent that does nothing 0; and the pieces (the image map, the FROM rewrite, a build
that fails)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from rollout.core.envs import Case, DatasetConfig, EnvConfig, RuntimeConfig
from rollout.sandbox import images
from rollout.sandbox.images import ImageError, ImageSource, mapped_dockerfile, source_for
from tests.rollout.sandbox_helpers import require_bwrap
from tests.rollout.test_harbor_tasks import run_job
from tests.test_launcher import REPO

BASE = "localhost/rollout-test/python:3"
TASKS = REPO / "examples" / "harbor_image" / "tasks"


def require_image_tools() -> None:
    missing = [t for t in (*images.TOOLS, "mmdebstrap") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (apt-get install buildah skopeo umoci mmdebstrap)")


def build_base_image() -> str:
    """The stand-in base image in the local container store (built once per machine; skips
    without the image tools)."""
    require_image_tools()
    p = subprocess.run(
        [str(REPO / "scripts" / "build_base_images.sh"), BASE], capture_output=True, text=True, timeout=900
    )
    assert p.returncode == 0, p.stderr[-2000:]
    return BASE


@pytest.fixture(scope="module")
def base_image() -> str:
    return build_base_image()


@pytest.fixture(scope="module")
def pip_base_image() -> str:
    """The ``--pip`` stand-in (``python``, ``pip`` installing system-wide: a python:3.N-slim's)."""
    require_image_tools()
    p = subprocess.run(
        [str(REPO / "scripts" / "build_base_images.sh"), "--pip"], capture_output=True, text=True, timeout=900
    )
    assert p.returncode == 0, p.stderr[-2000:]
    return "localhost/rollout-test/python:3-pip"


def _cfg(fmt: str = "harbor", **more: object) -> EnvConfig:
    return EnvConfig.model_validate(
        {
            "name": "e",
            "dataset": DatasetConfig(format=fmt, path="t"),  # type: ignore[arg-type]
            "runtime": RuntimeConfig(command=["x"]),
            **more,
        }
    )


def test_the_image_map_replaces_references_and_from_lines() -> None:
    cfg = _cfg(images={"python:3": "localhost/a:1", "org/img:1": "localhost/b:2"})
    row = {"image_ref": "org/img:1"}
    src = source_for(cfg, Case(env_name="e", case_id="c", row=row), (("python:3", "localhost/cli:9"),))
    assert src is not None and src.ref == "org/img:1" and src.mapped("org/img:1") == "localhost/b:2"
    assert src.mapped("python:3") == "localhost/cli:9"  # --image wins over the env's images
    text = "# x\nFROM python:3 AS build\nRUN echo FROM python:3\nfrom --platform=linux/amd64 python:3\nFROM other\n"
    assert mapped_dockerfile(text, src) == (
        "# x\nFROM localhost/cli:9 AS build\nRUN echo FROM python:3\nfrom --platform=linux/amd64 localhost/cli:9\n"
        "FROM other\n"
    )
    assert source_for(_cfg(), Case(env_name="e", case_id="c", row={})) is None
    env_wide = source_for(_cfg(fmt="jsonl", image="debian:12"), Case(env_name="e", case_id="c", row={}))
    assert env_wide == ImageSource(ref="debian:12", image_map=())


def test_a_build_that_fails_fails_with_its_log_tail_and_is_not_built_again(
    tmp_path: Path, base_image: str
) -> None:
    ctx = tmp_path / "broken" / "environment"
    ctx.mkdir(parents=True)
    (ctx / "Dockerfile").write_text("FROM python:3\nRUN echo the-step-output && exit 3\n")
    src = ImageSource(context=ctx, image_map=(("python:3", base_image),))
    images.forget()
    with pytest.raises(ImageError) as first:
        images.resolve(src, tmp_path / "cache")
    assert "failed (exit code" in str(first.value) and "the-step-output" in str(first.value)
    with pytest.raises(ImageError) as again:  # kept for the job: the same error, no second build
        images.resolve(src, tmp_path / "cache")
    assert again.value is first.value


async def test_a_task_with_a_dockerfile_runs_in_its_image(tmp_path: Path, base_image: str) -> None:
    require_bwrap()
    records, _, stderr = await run_job(
        tmp_path,
        "--tasks",
        str(TASKS),
        "--image",
        f"python:3={base_image}",
        "--harness",
        "oracle",
        "--harness",
        str(REPO / "attacks" / "do-nothing"),
        "--job-id",
        "img",
        "--pool-size",
        "2",
    )
    got = {r["harness"]: r for r in records}
    assert set(got) == {"oracle", "do-nothing"}, stderr[-3000:]
    oracle, nothing = got["oracle"], got["do-nothing"]
    assert (oracle["eval_status"], oracle["score"], oracle["sandbox"]) == ("scored", 10.0, "bwrap"), oracle
    assert oracle["reason"].startswith("verifier reward 1: read from reward.txt"), oracle["reason"]
    assert (nothing["eval_status"], nothing["score"]) == ("scored", 0.0), nothing


async def test_a_slim_python_dockerfile_pip_installs_on_the_pip_stand_in(
    tmp_path: Path, pip_base_image: str
) -> None:
    """A task written for python:3.N-slim (``pip install`` in a RUN step, ``python`` and
    ``python -m pytest`` in its scripts) runs as published on the ``--pip`` stand-in."""
    require_bwrap()
    task = tmp_path / "tasks" / "slim"
    env = task / "environment"
    (env / "greet").mkdir(parents=True)
    (env / "greet" / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "greetpkg"\nversion = "1.0"\n'
    )
    (env / "greet" / "greetpkg.py").write_text("def hello():\n    return 'hello'\n")
    (env / "Dockerfile").write_text(
        "FROM python:3.12-slim\nWORKDIR /app\nCOPY greet /tmp/greet\n"
        "RUN pip install --no-index --no-build-isolation /tmp/greet && python -c 'import greetpkg'\n"
    )
    (task / "instruction.md").write_text("Write greetpkg.hello() to /app/out.txt.\n")
    (task / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 120.0\n')
    (task / "solution").mkdir()
    (task / "solution" / "solve.sh").write_text(
        "#!/bin/bash\npython -c \"import greetpkg; open('/app/out.txt', 'w').write(greetpkg.hello())\"\n"
    )
    (task / "tests").mkdir()
    (task / "tests" / "test_out.py").write_text(
        "from pathlib import Path\n\ndef test_out():\n    assert Path('/app/out.txt').read_text() == 'hello'\n"
    )
    (task / "tests" / "test.sh").write_text(
        "#!/bin/bash\ncd /app && python -m pytest -q -p no:cacheprovider /tests/test_out.py "
        "&& echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n"
    )
    records, _, stderr = await run_job(
        tmp_path,
        "--tasks",
        str(tmp_path / "tasks"),
        "--image",
        f"python:3.12-slim={pip_base_image}",
        "--harness",
        "oracle",
        "--harness",
        str(REPO / "attacks" / "do-nothing"),
        "--job-id",
        "slim",
    )
    got = {r["harness"]: (r["eval_status"], r["score"]) for r in records}
    assert got == {"oracle": ("scored", 10.0), "do-nothing": ("scored", 0.0)}, stderr[-3000:]


def _harbor_task(root: Path, name: str, solve: str, test: str) -> None:
    task = root / "tasks" / name
    (task / "environment").mkdir(parents=True)
    (task / "environment" / "Dockerfile").write_text("FROM python:3\nWORKDIR /app\n")
    (task / "instruction.md").write_text("Do what the solution does.\n")
    (task / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 60.0\n')
    for folder, file, text in (("solution", "solve.sh", solve), ("tests", "test.sh", test)):
        (task / folder).mkdir()
        (task / folder / file).write_text("#!/bin/bash\n" + text)
        (task / folder / file).chmod(0o755)


def _system_tasks(root: Path) -> Path:
    """Harbor tasks whose solutions change the image outside its WORKDIR: ``configure`` writes
    ``/etc`` and ``/tmp`` and removes a folder the image holds (its test checks all three);
    ``clobber`` fails its task and puts a file and a link where the verifier mounts ``/tests`` and
    ``/logs``, ``libc`` breaks the image's C library (outages they would like to cause)."""
    _harbor_task(
        root,
        "configure",
        "set -e\necho configured > /etc/greeting.conf\necho t > /tmp/marker\nrm -rf /usr/share/doc/gzip\n",
        "echo 0 > /logs/verifier/reward.txt\n"
        "grep -qx configured /etc/greeting.conf && [ ! -e /usr/share/doc/gzip ] && [ -d /usr/share/doc ] "
        "&& grep -qx t /tmp/marker && echo 1 > /logs/verifier/reward.txt\n",
    )
    _harbor_task(
        root,
        "clobber",
        "rm -rf /tests; echo x > /tests; ln -s /nonexistent /logs\n",
        "echo 0 > /logs/verifier/reward.txt\n[ -e /app/solved ] && echo 1 > /logs/verifier/reward.txt\n",
    )
    _harbor_task(  # the verifier's interpreter cannot start on this layer: still its own 0
        root,
        "libc",
        "echo broken > /usr/lib/x86_64-linux-gnu/libc.so.6\n",
        "echo 0 > /logs/verifier/reward.txt\n[ -e /app/solved ] && echo 1 > /logs/verifier/reward.txt\n",
    )
    return root / "tasks"


async def test_a_dockerfile_tasks_build_context_is_not_copied_over_its_workdir(
    tmp_path: Path, base_image: str
) -> None:
    """The workspace is what the image's WORKDIR holds after the build (a RUN step's change
    included), never the task's ``environment/`` folder copied over it."""
    require_bwrap()
    task = tmp_path / "tasks" / "ctx"
    (task / "environment").mkdir(parents=True)
    (task / "environment" / "Dockerfile").write_text(
        "FROM python:3\nWORKDIR /app\nCOPY name.txt /app/name.txt\nRUN echo changed > /app/name.txt\n"
    )
    (task / "environment" / "name.txt").write_text("original\n")
    (task / "environment" / "secret.txt").write_text("never copied by the Dockerfile\n")
    (task / "instruction.md").write_text("Nothing to do.\n")
    (task / "task.toml").write_text('version = "1.0"\n')
    (task / "solution").mkdir()
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\ntrue\n")
    (task / "tests").mkdir()
    (task / "tests" / "test.sh").write_text(
        "#!/bin/bash\necho 0 > /logs/verifier/reward.txt\n"
        '[ "$(cat /app/name.txt)" = changed ] && [ ! -e /app/secret.txt ] && [ ! -e /app/Dockerfile ] '
        "&& echo 1 > /logs/verifier/reward.txt\n"
    )
    records, _, stderr = await run_job(
        tmp_path,
        "--tasks",
        str(task.parent),
        "--image",
        f"python:3={base_image}",
        "--harness",
        "oracle",
        "--job-id",
        "ctx",
    )
    assert [(r["eval_status"], r["score"]) for r in records] == [("scored", 10.0)], stderr[-3000:]


async def test_same_container_verifies_on_the_agents_layer_and_every_record_says_so(
    tmp_path: Path, base_image: str
) -> None:
    """By default the tests run in a fresh copy of the image (what the agent wrote outside /app is
    gone: 0); with ``--same-container`` on the agent's own layer, its files written (``/tmp``
    included) and its folder removed (whiteout) all seen: 10, flagged in the record and under the
    table. A layer that clobbers the verifier's mount points is the agent's 0 either way. No layer
    is left."""
    require_bwrap()
    tasks = _system_tasks(tmp_path)
    got = {}
    for flag in ((), ("--same-container",)):
        run = tmp_path / ("same" if flag else "fresh")
        run.mkdir()
        scratch = Path(tempfile.mkdtemp(prefix="sc-", dir="/tmp"))  # short: the bridge's socket lives there
        records, stdout, stderr = await run_job(
            run,
            "--tasks",
            str(tasks),
            *flag,
            "--image",
            f"python:3={base_image}",
            "--harness",
            "oracle",
            "--job-id",
            "sc",
            tmpdir=scratch,
        )
        assert len(records) == 3, stderr[-3000:]
        by_case = {r["case_id"]: r for r in records}
        for case in ("clobber", "libc"):  # their own 0, never an outage
            r = by_case[case]
            assert (r["eval_status"], r["score"], len(r["attempts"])) == ("scored", 0.0, 1), r
        if flag:
            assert "the agent's layer stopped it" in by_case["libc"]["reason"], by_case["libc"]["reason"]
        got[bool(flag)] = by_case["configure"], stdout + stderr
        assert not list(scratch.glob("rollout-layer-*"))
        shutil.rmtree(scratch)
    fresh, fresh_out = got[False]
    same, same_out = got[True]
    assert (fresh["score"], fresh["verifier_container"]) == (0.0, "fresh"), fresh
    assert (same["eval_status"], same["score"], same["verifier_container"]) == ("scored", 10.0, "same"), same
    assert "verified in the agent's own container" in same_out
    assert "verified in the agent's own container" not in fresh_out


async def test_a_task_whose_image_does_not_build_fails_as_setup_and_the_job_goes_on(
    tmp_path: Path, base_image: str
) -> None:
    require_bwrap()
    tasks = tmp_path / "tasks"
    shutil.copytree(TASKS / "greet_name", tasks / "greet_name")
    shutil.copytree(TASKS / "greet_name", tasks / "broken")
    (tasks / "broken" / "environment" / "Dockerfile").write_text(
        "FROM python:3\nRUN echo the-broken-step && exit 3\n"
    )
    records, _, stderr = await run_job(
        tmp_path,
        "--tasks",
        str(tasks),
        "--image",
        f"python:3={base_image}",
        "--harness",
        "oracle",
        "--job-id",
        "bad",
        "--max-retries",
        "1",
        exit_code=3,
    )  # 3: a session lost to an infrastructure failure
    got = {r["case_id"]: r for r in records}
    assert set(got) == {"greet_name", "broken"}, stderr[-3000:]
    assert (got["greet_name"]["eval_status"], got["greet_name"]["score"]) == ("scored", 10.0)
    broken = got["broken"]
    # one attempt: the job keeps the failure, so a retry would only get it again
    assert (broken["status"], broken["outcome"], broken["score"], len(broken["attempts"])) == (
        "error",
        "setup_failed",
        None,
        1,
    ), broken
    assert "circuit breaker" not in stderr  # a task's image says nothing of the gateway
    assert (
        broken["error"].startswith("sandbox setup failed: image: building ")
        and "the-broken-step" in broken["error"]
    )


async def test_the_audit_runs_an_image_task_with_the_image_map(tmp_path: Path, base_image: str) -> None:
    """``launcher.py audit --tasks ... --image REF=LOCAL``: the audit's job gets the image map, so the
    task's Dockerfile builds FROM the local base; its sanity rows are judged in the image."""
    require_bwrap()
    from rollout.audit.audit import AuditOptions, run_audit

    report = await run_audit(
        AuditOptions(
            tasks=[TASKS],
            image=[f"python:3={base_image}"],
            attacks=["empty-answer"],
            db_path=f"sqlite://{tmp_path / 'a.db'}",
            out=tmp_path / "a.jsonl",
        )
    )
    (row,) = report.sanity
    assert (row.case, row.baseline, row.reference, row.reference_score) == (
        "greet_name",
        0.0,
        "solution/solve.sh",
        10.0,
    ), row
    assert not row.failed


def test_seeding_a_workspace_copies_files_never_devices_and_nothing_for_the_root(tmp_path: Path) -> None:
    """An unpacked image holds device nodes (``/dev/full`` reads forever) and FIFOs: the copy of its
    WORKDIR takes folders, regular files and links only; a WORKDIR of ``/`` never copies the root."""
    import os

    from rollout.sandbox.images import ImageRoot, seed_workspace

    rootfs = tmp_path / "rootfs"
    app = rootfs / "app"
    (app / "sub").mkdir(parents=True)
    (app / "sub" / "a.txt").write_text("a")
    (app / "link").symlink_to("sub/a.txt")
    os.mkfifo(app / "pipe")
    os.mknod(app / "full", 0o666 | 0o020000, os.makedev(1, 7))  # a character device, as /dev/full
    ws = tmp_path / "ws"
    seed_workspace(ImageRoot(digest="d", rootfs=rootfs, workdir="/app"), ws)
    assert sorted(str(p.relative_to(ws)) for p in ws.rglob("*")) == ["link", "sub", "sub/a.txt"]
    assert os.readlink(ws / "link") == "sub/a.txt"
    root_ws = tmp_path / "root-ws"
    root_ws.mkdir()
    seed_workspace(ImageRoot(digest="d", rootfs=rootfs, workdir="/"), root_ws)
    assert list(root_ws.iterdir()) == []


def test_a_workspace_starts_as_what_the_image_holds_where_it_is_bound(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    for f in ("usr/bin/tool", "app/main.py", "workspace/seed.txt"):
        (rootfs / f).parent.mkdir(parents=True, exist_ok=True)
        (rootfs / f).write_text(f)
    at_app, at_root = tmp_path / "at-app", tmp_path / "at-root"
    images.seed_workspace(images.ImageRoot(digest="d", rootfs=rootfs, workdir="/app/"), at_app)
    images.seed_workspace(images.ImageRoot(digest="d", rootfs=rootfs, workdir="/"), at_root)
    assert sorted(str(p.relative_to(at_app)) for p in at_app.rglob("*")) == ["main.py"]
    # WORKDIR /: the workspace is /workspace; the root is the session's / already, never copied
    assert sorted(str(p.relative_to(at_root)) for p in at_root.rglob("*")) == ["seed.txt"]


def _buildah(*args: str) -> str:
    p = subprocess.run(["buildah", *args], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout.strip()


def test_a_base_rebuilt_under_the_same_tag_builds_the_task_again(tmp_path: Path, base_image: str) -> None:
    """The build's tag hashes each base image's digest in the local store: a different image under
    the base's tag gives a new tag and a build FROM the new base, never the old build."""
    import uuid

    base = f"localhost/rollout-test/rebased-{uuid.uuid4().hex[:12]}:1"
    ctx = tmp_path / "rebased" / "environment"
    ctx.mkdir(parents=True)
    (ctx / "Dockerfile").write_text("FROM python:3\nLABEL task=rebased\n")
    src = ImageSource(context=ctx, image_map=(("python:3", base),))
    built: list[str] = []
    ctr = _buildah("from", "scratch")
    try:
        _buildah("tag", base_image, base)
        first = images.build(src)
        built.insert(0, first)
        _buildah("config", "--label", "base=second", ctr)
        built.append(_buildah("commit", "--quiet", ctr, base))  # another image under the same tag
        second = images.build(src)
        built.insert(0, second)
        _buildah("tag", base_image, base)  # the first base again: its build is found, not rebuilt
        again = images.build(src)
        labels = [images._config(ref)[1]["config"].get("Labels") or {} for ref in (first, second)]
    finally:
        for ref in (*built, base):
            subprocess.run(["buildah", "rmi", "-f", ref], capture_output=True, timeout=300)
        subprocess.run(["buildah", "rm", ctr], capture_output=True, timeout=300)
    assert first.startswith("localhost/rollout-build/context:") and second.startswith(
        "localhost/rollout-build/context:"
    )
    assert second != first and again == first
    assert (labels[0].get("task"), labels[0].get("base")) == ("rebased", None)
    assert (labels[1].get("task"), labels[1].get("base")) == ("rebased", "second")


def test_the_bases_of_a_dockerfile_skip_stages_scratch_and_build_args() -> None:
    text = (
        "FROM localhost/a:1 AS build\nFROM build\nFROM --platform=linux/amd64 b:2 as Two\nFROM two\n"
        "FROM scratch\nFROM ${BASE}\nFROM localhost/a:1\n"
    )
    assert images.bases(text) == ["localhost/a:1", "b:2"]


def test_tasks_with_the_same_build_context_share_one_build(tmp_path: Path) -> None:
    """The build's tag is the content's, not the task's: two tasks whose ``environment/`` folders
    are the same build (and unpack) once; a byte of difference is another build."""
    refs = []
    for task, text in (("a", "x"), ("b", "x"), ("c", "y")):
        ctx = tmp_path / task / "environment"
        ctx.mkdir(parents=True)
        (ctx / "Dockerfile").write_text("FROM scratch\nCOPY f /f\n")
        (ctx / "f").write_text(text)
        refs.append(images.build_ref(ImageSource(context=ctx))[0])
    assert refs[0] == refs[1] != refs[2] and refs[0].startswith("localhost/rollout-build/context:"), refs
