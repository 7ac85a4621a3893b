"""Logging of the launcher's commands (run, regrade, view, report, feed, export, serve): one format."""

from __future__ import annotations

import logging

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(level: object) -> None:
    """Log to stderr at ``level`` (a name such as ``info``, any case) in :data:`LOG_FORMAT`."""
    logging.basicConfig(level=str(level).upper(), format=LOG_FORMAT)
