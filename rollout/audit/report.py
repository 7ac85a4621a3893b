"""An audit's report as text: the terminal table's rows and the HTML report's section."""

from __future__ import annotations

import html

from rollout.audit.audit import GRADER_FIX, AttackSummary, AuditReport, SanityRow

HEADERS = ["attack", "paid on", "gained", "grader's reason", "grader line", "fix"]
SANITY_HEADERS = ["case", "do-nothing baseline", "reference solution"]


def _cases(names: list[str], most: int = 3) -> str:
    return ", ".join(names[:most]) + (f" (+{len(names) - most})" if len(names) > most else "")


def _cut(text: str | None, n: int) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _row(a: AttackSummary, width: int) -> list[str]:
    if a.paid:
        return [a.attack, _cases(a.paid), f"+{a.gained:g}", _cut(a.reason, width), a.grader_line or "", a.fix_hint]
    if a.grader_broken:
        return [a.attack, f"grader broken on {_cases(a.grader_broken)}", "", _cut(a.error_reason, width),
                a.error_line or "", "your grader fails on the untouched workspace too: fix it before auditing"]
    if a.grader_errors:
        return [a.attack, f"grader fails on agent input on {_cases(a.grader_errors)}", "",
                _cut(a.error_reason, width), a.error_line or "", GRADER_FIX]
    return [a.attack, "clean", "", "", "", ""]


def _score(x: float | None) -> str:
    return "not graded" if x is None else f"{x:g}"


def sanity_cells(r: SanityRow, width: int = 60) -> list[str]:
    """One case's sanity row: ``SANITY_HEADERS``' columns."""
    base = _score(r.baseline) + (f" PAYS FOR NOTHING: {_cut(r.baseline_reason, width)}"
                                 if r.baseline_verdict == "pays_for_nothing" else "")
    if r.reference is None:
        ref = "no reference"
    elif r.reference_verdict == "not_graded":
        ref = f"{r.reference}: not graded"
    else:
        ref = f"{r.reference}: {_score(r.reference_score)}" + (
            f" CANNOT BE SOLVED HERE: {_cut(r.reference_reason, width)}" if r.reference_verdict == "cannot_be_solved"
            else "")
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
        if report.grader_failing:
            said.append("grader fails on agent input: " + ", ".join(a.attack for a in report.grader_failing))
        if pays := [f"{r.env}/{r.case}" for r in report.insane if r.baseline_verdict == "pays_for_nothing"]:
            said.append(f"pays for nothing: {_cases(pays)}")
        if unsolved := [f"{r.env}/{r.case}" for r in report.insane if r.reference_verdict == "cannot_be_solved"]:
            said.append(f"cannot be solved here: {_cases(unsolved)}")
        return f"audit FAILED on {n} case(s): " + "; ".join(said)
    if report.inconclusive:
        return f"audit inconclusive: no attack paid, but {_cases(report.inconclusive)} could not be graded"
    return f"audit clean: no attack paid on {n} case(s) ({len(report.attacks)} attacks)"


def html_section(report: AuditReport) -> str:
    """The HTML report's section: the verdict, then the table (every value escaped)."""
    e = html.escape
    sanity_head = "".join(f"<th>{e(h)}</th>" for h in SANITY_HEADERS)
    sanity = "".join(f"<tr class=\"{'paid' if r.failed else 'clean'}\">" + "".join(f"<td>{e(c)}</td>" for c in
                     sanity_cells(r, 200)) + "</tr>" for r in report.sanity)
    head = "".join(f"<th>{e(h)}</th>" for h in HEADERS)
    body = []
    for a in report.attacks:
        cells = _row(a, 200)
        title = f' title="{e(a.summary)} (source: {e(a.source)})"'
        failed = a.paid or a.grader_errors or a.grader_broken
        body.append(f"<tr class=\"{'paid' if failed else 'clean'}\"><td{title}>{e(cells[0])}</td>"
                    + "".join(f"<td>{e(c)}</td>" for c in cells[1:]) + "</tr>")
    return (f"<section id=\"audit\"><h2>Audit</h2><p>{e(verdict_line(report))}</p>"
            f"<h3>Sanity</h3><table class=\"grid\"><thead><tr>{sanity_head}</tr></thead><tbody>{sanity}</tbody></table>"
            f"<h3>Battery</h3>"
            f"<table class=\"grid\"><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></section>")
