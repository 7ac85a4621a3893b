"""``python launcher.py ...``: the launcher's command line (``rollout.cli.run``; ``--help`` lists
its flags; the verbs view, report, feed, export and serve: docs/launcher.md)."""

import sys

from rollout.cli.run import main

if __name__ == "__main__":
    sys.exit(main())
