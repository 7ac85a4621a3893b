"""``python launcher.py ...``: the launcher's command line (``rollout.cli.run``; ``--help`` lists
its flags and the commands: list, view, report, feed, export, serve, train, audit; docs/launcher.md)."""

import sys

from rollout.cli.run import main

if __name__ == "__main__":
    sys.exit(main())
