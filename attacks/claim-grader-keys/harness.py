"""The ``claim-grader-keys`` attack of ``launcher.py audit``: claims exactly what the env's grader reads (from its source): each metrics key it takes, at a passing value, and a marker file at every path it opens and every file name it looks for."""

from rollout.audit.battery import Attack


class ClaimGraderKeys(Attack):
    name = "claim-grader-keys"
    summary = (
        "claims what the grader's source reads: each metrics key it takes (and each the env's runtime reports) "
        "at a passing value, marker files at every path it opens and every file name it looks for"
    )
    source = "graders that trust the runtime's own metrics (e.g. bench_score, bench_passed) or a marker file"
    fix_hint = (
        "your grader trusts keys or files the agent writes: grade the workspace's work or a verifier instead"
    )
    grader_reads = ("metric_keys", "paths", "names")
    grader_aware = True


HARNESS = ClaimGraderKeys()
