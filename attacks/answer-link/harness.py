"""The ``answer-link`` attack of ``launcher.py audit``: the answer files as links (to /dev/zero, to /etc/passwd, to the workspace's parent)."""

from rollout.audit.battery import Attack


class AnswerLink(Attack):
    name = "answer-link"
    summary = "the answer files as links (to /dev/zero, to /etc/passwd, to the workspace's parent)"
    source = "graders that open the answer path on the live workspace and follow links (reading host files)"
    fix_hint = (
        "your grader follows links or fails open on a missing answer: grade regular files of the copy only"
    )


HARNESS = AnswerLink()
