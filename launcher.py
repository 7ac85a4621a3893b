"""``python launcher.py ...``: the launcher's command line (``rollout.cli.run``; ``--help`` lists
its flags and verbs). Exit codes and flags: docs/evaluation.md and README.md."""

import sys

from rollout.cli.run import main

if __name__ == "__main__":
    sys.exit(main())
