"""The battery of ``launcher.py audit``: attack plugins (harness folders whose ``harness.py``
defines ``HARNESS``, an ``Attack``, and whose ``run.py`` is the session's runtime) and the
do-nothing baseline every attack is measured against. Bundled attacks live in ``attacks/<name>/``;
adding one: docs/audit.md."""

from __future__ import annotations

from pathlib import Path

from rollout.contract.harness import Harness, HarnessContext, HarnessLaunch, HarnessUnavailable
from rollout.sandbox.harness_cache import PROJECT_ROOT, LoadedHarness, bundled, load_harness

ATTACK_ROOT = PROJECT_ROOT / "attacks"
"""Where bundled attacks live: ``attacks/<name>/harness.py`` + ``run.py``."""
REFERENCE_FOLDER = Path(__file__).resolve().parent / "reference"
"""The audit's reference run (not an attack): the case's reference solution, for the sanity row."""
REFERENCE = "audit-reference"
"""The reference run's harness name."""
BASELINE = "do-nothing"
"""The attack folder every other attack is measured against: it leaves the workspace as it is."""


class Attack(Harness):
    """Base class of an attack plugin: a harness whose own ``runtime`` (default ``run.py`` of its
    folder) is the session's runtime, so it controls everything an agent could (the workspace,
    the result line, the exit status). ``summary``: what it does; ``source``: where the field saw
    it; ``fix_hint``: one line telling a benchmark author how to stop it when it pays.
    ``grader_reads``: what of the grader's source scan (``rollout.audit.grader_scan.GraderScan``:
    ``metric_keys``, ``paths``, ``names``, ``evals``) a finding cites as the line it exploited;
    ``grader_aware``: the audit gives it that scan (``audit.json`` beside its ``run.py``)."""

    version = "1"
    runtime: str | None = "run.py"
    summary: str = ""
    source: str = ""
    fix_hint: str = ""
    grader_reads: tuple[str, ...] = ()
    grader_aware: bool = False

    def launch(self, ctx: HarnessContext) -> HarnessLaunch:
        raise NotImplementedError("an attack runs its own runtime (run.py), never the harness wrapper")


def load_attack(spec: str) -> LoadedHarness:
    """The attack ``spec``: a bundled name (``attacks/<name>/``) or a folder. Raises
    HarnessUnavailable when it is not found or its ``HARNESS`` is not an ``Attack``."""
    try:
        loaded = load_harness(spec, ATTACK_ROOT)
    except HarnessUnavailable as e:  # said of --harness: say it of --attack, naming the attacks
        attacks = ", ".join(n for n in bundled(ATTACK_ROOT) if n != BASELINE)
        raise HarnessUnavailable(
            f"--attack {spec}: no such attack (bundled: {attacks}; or give a folder holding a harness.py)"
        ) from e
    if not isinstance(loaded.harness, Attack):
        raise HarnessUnavailable(
            f"{loaded.folder}: HARNESS is not an attack (a rollout.audit.battery.Attack)"
        )
    return loaded


def battery(names: list[str] | None = None) -> list[LoadedHarness]:
    """The attacks to run (``names``: bundled names or folders; default every bundled attack),
    the baseline first and once. Raises HarnessUnavailable."""
    specs = names or [n for n in bundled(ATTACK_ROOT) if n != BASELINE]
    attacks = [load_attack(s) for s in dict.fromkeys(specs)]
    return [load_attack(BASELINE), *(a for a in attacks if a.name != BASELINE)]


def info(loaded: LoadedHarness) -> Attack:
    """The attack's metadata (its ``HARNESS``)."""
    assert isinstance(loaded.harness, Attack)
    return loaded.harness


def attack_folders(root: Path = ATTACK_ROOT) -> list[Path]:
    """The bundled attack folders, sorted by name."""
    return [root / n for n in bundled(root)]
