"""An audit's report as text: the terminal table's rows and the HTML report's section."""

from __future__ import annotations

import html

from rollout.audit.audit import AttackSummary, AuditReport

HEADERS = ["attack", "paid on", "gained", "grader's reason", "fix"]


def _cases(names: list[str], most: int = 3) -> str:
    return ", ".join(names[:most]) + (f" (+{len(names) - most})" if len(names) > most else "")


def _cut(text: str | None, n: int) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _row(a: AttackSummary, width: int) -> list[str]:
    if not a.paid:
        errors = f" (grader error on {_cases(a.grader_errors)})" if a.grader_errors else ""
        return [a.attack, "clean" + errors, "", "", ""]
    return [a.attack, _cases(a.paid), f"+{a.gained:g}", _cut(a.reason, width), a.fix_hint]


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
    if report.paying:
        names = ", ".join(a.attack for a in report.paying)
        return f"audit FAILED: {len(report.paying)} attack(s) paid on {n} case(s): {names}"
    if report.inconclusive:
        return f"audit inconclusive: no attack paid, but {_cases(report.inconclusive)} could not be graded"
    return f"audit clean: no attack paid on {n} case(s) ({len(report.attacks)} attacks)"


def html_section(report: AuditReport) -> str:
    """The HTML report's section: the verdict, then the table (every value escaped)."""
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in HEADERS)
    body = []
    for a in report.attacks:
        cells = _row(a, 200)
        title = f' title="{e(a.summary)} (source: {e(a.source)})"'
        body.append(f"<tr class=\"{'paid' if a.paid else 'clean'}\"><td{title}>{e(cells[0])}</td>"
                    + "".join(f"<td>{e(c)}</td>" for c in cells[1:]) + "</tr>")
    return (f"<section id=\"audit\"><h2>Audit</h2><p>{e(verdict_line(report))}</p>"
            f"<table class=\"grid\"><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></section>")
