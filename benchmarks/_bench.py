"""The benchmarks' shared harness: arguments, timing, percentiles, ratios and one output format.

Every benchmark is a script (``python benchmarks/NAME.py``) that imports this sibling module. Its
output: a context line (benchmark, date, machine, load, commit), then tables and lines of text;
``--json PATH`` writes the same as JSON; ``--quick`` runs the script's smallest settings (a smoke
run of seconds). Machines here are shared and noisy: compare columns of one run, not runs, which
is why variants are measured alternately (:func:`alternate`) and reported as ratios.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"

# ------------------------------------------------------------------------------------ arguments


class _Parser(argparse.ArgumentParser):
    def __init__(self, quick: dict[str, Any], **kw: Any) -> None:
        super().__init__(**kw)
        self.quick = quick

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        ns = super().parse_args(args, namespace)
        if getattr(ns, "quick", False):
            self.set_defaults(**self.quick)  # the quick settings replace the defaults; explicit options win
            ns = super().parse_args(args, namespace)
        return ns


def parser(doc: str | None, quick: dict[str, Any]) -> argparse.ArgumentParser:
    """An argument parser described by the first line of ``doc``, with the common options
    ``--quick`` (the defaults in ``quick`` instead: the smallest run that still measures
    everything once) and ``--json PATH`` (also write the results there)."""
    ap = _Parser(quick, description=(doc or "").strip().splitlines()[0])
    ap.add_argument(
        "--quick",
        action="store_true",
        help="smallest settings: " + " ".join(f"--{k.replace('_', '-')} {_arg(v)}" for k, v in quick.items()),
    )
    ap.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON to PATH")
    return ap


def _arg(v: Any) -> str:
    return " ".join(map(str, v)) if isinstance(v, list | tuple) else str(v)


# --------------------------------------------------------------------------------------- timing


def cpu_s(who: int = resource.RUSAGE_SELF) -> float:
    """User + system CPU seconds of this process (or ``resource.RUSAGE_CHILDREN``: its waited-for children)."""
    ru = resource.getrusage(who)
    return ru.ru_utime + ru.ru_stime


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a running process and all its threads (``/proc/PID/stat``);
    raises OSError once it is gone."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_mib(pid: int, key: str = "VmRSS") -> float:
    """A memory figure of a running process in MiB (``VmRSS``: resident now; ``VmHWM``: its peak)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(f"/proc/{pid}/status has no {key}")


def host_cpu() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine since boot (``/proc/stat``)."""
    vals = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = vals[3] + vals[4]
    return float(sum(vals) - idle), float(sum(vals))


CPUACCT = Path("/sys/fs/cgroup/cpuacct")


@contextmanager
def cpuacct_group(name: str) -> Iterator[Callable[[], float] | None]:
    """This process, and what it starts from now on, in a fresh cgroup v1 ``cpuacct`` group:
    yields a function giving the group's CPU seconds so far (None without root or that
    hierarchy); the process goes back to its group and the group is removed at the end."""
    if os.geteuid() != 0 or not CPUACCT.is_dir():
        yield None
        return
    home = [
        line.split(":", 2)[2]
        for line in Path("/proc/self/cgroup").read_text().splitlines()
        if "cpuacct" in line.split(":")[1].split(",")
    ]
    group = CPUACCT / f"{name}-{os.getpid()}-{time.monotonic_ns() % 10**9}"
    group.mkdir()
    try:
        (group / "cgroup.procs").write_text(str(os.getpid()))
        yield lambda: int((group / "cpuacct.usage").read_text()) / 1e9
    finally:
        (CPUACCT / home[0].lstrip("/") / "cgroup.procs").write_text(str(os.getpid()))
        for _ in range(100):  # what this process started may still be ending
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


@dataclass
class Span:
    """What :func:`timed` measured: wall seconds and this process's CPU seconds."""

    wall_s: float = 0.0
    cpu_s: float = 0.0


@contextmanager
def timed() -> Iterator[Span]:
    """``with timed() as t: ...``, then ``t.wall_s`` and ``t.cpu_s`` (``perf_counter`` and rusage)."""
    span = Span()
    t0, c0 = time.perf_counter(), cpu_s()
    try:
        yield span
    finally:
        span.wall_s, span.cpu_s = time.perf_counter() - t0, cpu_s() - c0


async def alternate(
    rounds: int, variants: Sequence[str], one: Callable[[str, int], Awaitable[float | None]], warmup: int = 0
) -> dict[str, list[float]]:
    """Run ``one(variant, i)`` for ``i`` in ``range(warmup + rounds)``, the variants in turn
    within each round, so that machine noise hits them alike; keeps what each call returns
    (seconds, usually; None: nothing to keep) except in the ``warmup`` first rounds."""
    out: dict[str, list[float]] = {v: [] for v in variants}
    for i in range(warmup + rounds):
        for v in variants:
            got = await one(v, i)
            if i >= warmup and got is not None:
                out[v].append(got)
    return out


# ------------------------------------------------------------------------------ summaries, ratios


def percentile(xs: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``xs``, linear between the closest ranks (numpy's
    default); the median is ``percentile(xs, 50)``."""
    if not xs:
        raise ValueError("percentile of no samples")
    s = sorted(xs)
    k = (len(s) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def median(xs: Sequence[float]) -> float:
    return percentile(xs, 50)


def ms(xs: Sequence[float], q: float = 50) -> float:
    """A percentile of samples in seconds, in milliseconds (default: the median)."""
    return percentile(xs, q) * 1000


def ratio(a: float, b: float) -> float:
    """``a / b``, NaN when ``b`` is 0 (printed as ``-``)."""
    return a / b if b else math.nan


# --------------------------------------------------------------------------------------- output


def _default_fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return f"{v:,d}"
    if isinstance(v, float):
        return f"{v:,.2f}"
    return str(v)


class Table:
    """Rows under named columns. A column is a name, or ``(name, format spec)`` for its numbers
    (e.g. ``(\"req/s\", \",.0f\")``); None and NaN print as ``-``. The first column is left-aligned,
    the others right-aligned. The JSON keeps the raw values."""

    def __init__(self, title: str, columns: Sequence[str | tuple[str, str]]) -> None:
        self.title = title
        self.columns = [c if isinstance(c, str) else c[0] for c in columns]
        self.formats = ["" if isinstance(c, str) else c[1] for c in columns]
        self.rows: list[list[Any]] = []

    def add(self, *values: Any) -> None:
        if len(values) != len(self.columns):
            raise ValueError(f"{self.title}: {len(values)} values for {len(self.columns)} columns")
        self.rows.append(list(values))

    def _cell(self, v: Any, fmt: str) -> str:
        if fmt and isinstance(v, int | float) and not isinstance(v, bool) and not math.isnan(v):
            return format(v, fmt)
        return _default_fmt(v)

    def render(self) -> str:
        cells = [[self._cell(v, f) for v, f in zip(row, self.formats, strict=True)] for row in self.rows]
        widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(self.columns)]

        def line(parts: Sequence[str]) -> str:
            return "  ".join(
                p.ljust(w) if i == 0 else p.rjust(w)
                for i, (p, w) in enumerate(zip(parts, widths, strict=True))
            )

        head = line(self.columns)
        return "\n".join([self.title, head, "-" * len(head), *(line(r) for r in cells)])

    def as_json(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "columns": self.columns,
            "rows": [[_jsonable(v) for v in r] for r in self.rows],
        }


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, Path):
        return str(v)
    return v


def machine() -> dict[str, Any]:
    """Where the run happens: host name, CPU model and count, load average now, Python."""
    model = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        platform.processor() or "?",
    )
    return {
        "host": socket.gethostname(),
        "cpu": model,
        "cpus": os.cpu_count(),
        "load_average": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
    }


def commit(repo: Path = REPO) -> str:
    """The short commit of ``repo`` with ``+`` when its tracked files have changes, or ``not a git
    checkout``."""
    try:
        head = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(repo), "diff", "--quiet", "HEAD"], capture_output=True
        ).returncode
    except (OSError, subprocess.CalledProcessError):
        return "not a git checkout"
    return head + ("+" if dirty else "")


class Report:
    """One benchmark run's output. Prints the context line at once, then each table and line as
    it is added; :meth:`finish` writes everything as JSON to ``--json`` when given."""

    def __init__(self, name: str, args: argparse.Namespace) -> None:
        self.name = name
        self.args = args
        self.started = datetime.now(UTC)
        self.machine = machine()
        self.commit = commit()
        self.tables: list[Table] = []
        self.lines: list[str] = []
        self.values: dict[str, Any] = {}
        m = self.machine
        print(
            f"# {name}: {self.started:%Y-%m-%d %H:%M} UTC, {m['host']} ({m['cpus']} x {m['cpu']}, load average "
            f"{m['load_average']}), commit {self.commit}{', --quick' if getattr(args, 'quick', False) else ''}",
            flush=True,
        )

    def table(self, table: Table) -> Table:
        """Print ``table`` (after a blank line) and keep it for the JSON."""
        self.tables.append(table)
        print(f"\n{table.render()}", flush=True)
        return table

    def line(self, text: str = "") -> None:
        """Print a line of text (a note, a total, a verdict) and keep it."""
        self.lines.append(text)
        print(text, flush=True)

    def value(self, key: str, v: Any) -> Any:
        """Keep a named result for the JSON (not printed)."""
        self.values[key] = v
        return v

    def finish(self) -> None:
        path = getattr(self.args, "json", None)
        if path is None:
            return
        doc = {
            "benchmark": self.name,
            "started": self.started.isoformat(),
            "machine": self.machine,
            "commit": self.commit,
            "args": {
                k: _jsonable(v) if not isinstance(v, list) else [_jsonable(x) for x in v]
                for k, v in vars(self.args).items()
            },
            "tables": [t.as_json() for t in self.tables],
            "values": self.values,
            "lines": self.lines,
        }
        Path(path).write_text(json.dumps(doc, indent=1, default=str) + "\n")
        print(f"results written to {path}")


# ------------------------------------------------------------------------------------ processes


def free_port() -> int:
    """A free TCP port on the loopback interface (bound then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen[Any] | None = None) -> None:
    """Poll ``url`` (GET) until it answers 2xx, at most ``timeout_s`` seconds. Raises
    RuntimeError when ``proc`` exits first or the time runs out."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with code {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if 200 <= r.status < 300:
                    return
        except OSError as e:
            last = e
        time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer within {timeout_s:.0f} s (last error: {last})")


def py_spy() -> str:
    """The py-spy executable (a tool, not a dependency: ``pip install py-spy``): on PATH or beside
    this Python."""
    return shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))


def collapsed_stacks(raw: Path) -> Iterator[tuple[list[str], int]]:
    """(frames, samples) per line of py-spy's raw (collapsed stack) output, outermost frame first."""
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            yield stack.split(";"), int(count)


def top_own(raw: Path, k: int = 25) -> list[tuple[str, float]]:
    """(function, share of samples) of the ``k`` functions with the most own time in a py-spy profile."""
    own: Counter[str] = Counter()
    for frames, n in collapsed_stacks(raw):
        own[frames[-1]] += n
    total = sum(own.values())
    return [(f, c / total) for f, c in own.most_common(k)] if total else []
