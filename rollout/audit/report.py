"""An audit's report as text: the terminal table's rows and the HTML report's section."""

from __future__ import annotations

import html

from rollout.audit.audit import GRADER_FIX, AttackSummary, AuditReport, SanityRow

HEADERS = ["attack", "paid on", "gained", "grader's reason", "grader line", "fix"]
SANITY_HEADERS = ["case", "do-nothing baseline", "reference solution"]
BROKEN_FIX = "your grader fails on the untouched workspace too: fix it before auditing"
GRADER_FAILURES = {
    "error": "grader error",
    "timeout": "grader timeout",
    "invalid_reward": "invalid reward",
    "grader_broken": "grader broken",
}
"""How a session's grading failed, by its eval_status (``GRADER_FAILED`` and ``grader_broken``)."""


def _cases(names: list[str], most: int = 3) -> str:
    return ", ".join(names[:most]) + (f" (+{len(names) - most})" if len(names) > most else "")


def _cut(text: str | None, n: int) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _row(a: AttackSummary, width: int) -> list[str]:
    if a.paid:
        return [
            a.attack,
            _cases(a.paid),
            f"+{a.gained:g}",
            _cut(a.reason, width),
            a.grader_line or "",
            a.fix_hint,
        ]
    where = [f"grader broken on {_cases(a.grader_broken)}"] if a.grader_broken else []
    where += [f"grader fails on agent input on {_cases(a.grader_errors)}"] if a.grader_errors else []
    if where:
        return [
            a.attack,
            "; ".join(where),
            "",
            _cut(a.error_reason, width),
            a.error_line or "",
            BROKEN_FIX if a.grader_broken else GRADER_FIX,
        ]
    return [a.attack, "clean", "", "", "", ""]


def _grader_failed(score: float | None, eval_status: str | None) -> str | None:
    """What happened to a session graded without a score: ``grader error``, ... (None: it has a
    score, or was not graded)."""
    return GRADER_FAILURES.get(eval_status or "") if score is None else None


def sanity_cells(r: SanityRow, width: int = 60) -> list[str]:
    """One case's sanity row: ``SANITY_HEADERS``' columns. A session graded without a score says
    how its grader failed, with the grader's reason; ``not graded`` only when it was not graded."""
    if (failed := _grader_failed(r.baseline, r.baseline_eval_status)) is not None:
        base = f"{failed}: {_cut(r.baseline_reason, width)}"
    else:
        base = ("not graded" if r.baseline is None else f"{r.baseline:g}") + (
            f" PAYS FOR NOTHING: {_cut(r.baseline_reason, width)}"
            if r.baseline_verdict == "pays_for_nothing"
            else ""
        )
    if r.reference is None:
        ref = "no reference"
    elif r.reference_verdict == "not_graded":
        ref = f"{r.reference}: not graded"
    else:
        failed = (
            GRADER_FAILURES.get(r.reference_eval_status or "")
            if r.reference_eval_status != "scored"
            else None
        )
        ref = (
            f"{r.reference}: {r.reference_score or 0.0:g}"
            + (f" ({failed})" if failed else "")
            + (
                f" CANNOT BE SOLVED HERE: {_cut(r.reference_reason, width)}"
                if r.reference_verdict == "cannot_be_solved"
                else ""
            )
        )
    return [f"{r.env}/{r.case}", base, ref]


def table_rows(report: AuditReport, width: int = 60) -> list[list[str]]:
    """One row per attack: ``HEADERS``' columns; a clean attack says so (and names cases whose
    grader failed on it)."""
    return [_row(a, width) for a in report.attacks]


def render_table(rows: list[list[str]], headers: list[str] = HEADERS) -> str:
    """A plain text table: one line per row, columns padded to their widest cell."""
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [headers, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def verdict_line(report: AuditReport) -> str:
    """The audit's one-line verdict."""
    n = len(report.cases)
    if report.failed:
        said = []
        if report.paying:
            said.append(f"{len(report.paying)} attack(s) paid: {', '.join(a.attack for a in report.paying)}")
        if broken := [a.attack for a in report.attacks if a.grader_broken]:
            said.append("grader broken (fails on the untouched workspace too): " + ", ".join(broken))
        if failing := [a.attack for a in report.attacks if a.grader_errors]:
            said.append("grader fails on agent input: " + ", ".join(failing))
        if pays := [f"{r.env}/{r.case}" for r in report.insane if r.baseline_verdict == "pays_for_nothing"]:
            said.append(f"pays for nothing: {_cases(pays)}")
        if unsolved := [
            f"{r.env}/{r.case}" for r in report.insane if r.reference_verdict == "cannot_be_solved"
        ]:
            said.append(f"cannot be solved here: {_cases(unsolved)}")
        return f"audit FAILED on {n} case(s): " + "; ".join(said)
    if report.inconclusive:
        base_failed = [
            f"{r.env}/{r.case}"
            for r in report.sanity
            if _grader_failed(r.baseline, r.baseline_eval_status) is not None
        ]
        said = (
            [f"the grader failed on the do-nothing baseline of {_cases(base_failed)}"] if base_failed else []
        )
        if rest := [c for c in report.inconclusive if c not in base_failed]:
            said.append(f"{_cases(rest)} could not be graded")
        return "audit inconclusive: no attack paid, but " + "; ".join(said)
    line = f"audit clean: no attack paid on {n} case(s) ({len(report.attacks)} attacks)"
    if report.same_container:
        line += (
            f"; not covered: {', '.join(report.same_container)} verify on the agent's own layer of the image "
            "(dataset.same_container), which the attacks never write"
        )
    return line


def html_section(report: AuditReport) -> str:
    """The HTML report's section: the verdict, then the table (every value escaped)."""
    e = html.escape
    sanity_head = "".join(f"<th>{e(h)}</th>" for h in SANITY_HEADERS)
    sanity = "".join(
        f'<tr class="{"paid" if r.failed else "clean"}">'
        + "".join(f"<td>{e(c)}</td>" for c in sanity_cells(r, 200))
        + "</tr>"
        for r in report.sanity
    )
    head = "".join(f"<th>{e(h)}</th>" for h in HEADERS)
    body = []
    for a in report.attacks:
        cells = _row(a, 200)
        title = f' title="{e(a.summary)} (source: {e(a.source)})"'
        failed = a.paid or a.grader_errors or a.grader_broken
        body.append(
            f'<tr class="{"paid" if failed else "clean"}"><td{title}>{e(cells[0])}</td>'
            + "".join(f"<td>{e(c)}</td>" for c in cells[1:])
            + "</tr>"
        )
    return (
        f'<section id="audit"><h2>Audit</h2><p>{e(verdict_line(report))}</p>'
        f'<h3>Sanity</h3><table class="grid"><thead><tr>{sanity_head}</tr></thead><tbody>{sanity}</tbody></table>'
        f"<h3>Battery</h3>"
        f'<table class="grid"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></section>'
    )
