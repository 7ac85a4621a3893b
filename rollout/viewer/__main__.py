"""``python -m rollout.viewer view|report ...``: the same as ``python launcher.py view|report``."""

import sys

from rollout.viewer.cli import main

sys.exit(main(sys.argv[1:]))
