"""Logging of the launcher's commands (run, regrade, view, report, feed, export, serve): one format,
and the notices the layers below the CLI give its user, which the CLI prints bare."""

from __future__ import annotations

import logging
import sys

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
NOTICES = "rollout.notice"
notices = logging.getLogger(NOTICES)
"""What a job or a server tells its user: ``notices.warning("warning: ...")``, ``notices.info(...)``
for what was set up. Log records like any other; ``setup_logging`` prints them bare on stderr."""


def plural(n: int, noun: str) -> str:
    """``n`` and ``noun``, the noun plural (an ``s``) unless ``n`` is 1: ``1 session``, ``2 sessions``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


class _BareToStderr(logging.Handler):
    """A notice's text alone, on the stderr of the moment."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(record.getMessage() + "\n")
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - logging's own contract: report, never raise
            self.handleError(record)


def _not_a_notice(record: logging.LogRecord) -> bool:
    return record.name != NOTICES


def setup_logging(level: object) -> None:
    """Log to stderr at ``level`` (a name such as ``info``, any case) in :data:`LOG_FORMAT`; notices
    bare, whatever ``level``."""
    root = logging.getLogger()
    before = set(root.handlers)
    logging.basicConfig(level=str(level).upper(), format=LOG_FORMAT)
    for handler in root.handlers:  # only the handler made here: others (a host's, pytest's) keep every record
        if handler not in before and _not_a_notice not in handler.filters:
            handler.addFilter(_not_a_notice)
    if not any(isinstance(h, _BareToStderr) for h in notices.handlers):
        notices.addHandler(_BareToStderr())
    notices.setLevel(logging.INFO)
