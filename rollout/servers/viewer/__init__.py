"""The trajectory viewer (a read-only web app on the store) and the HTML report of a job.

See docs/viewer.md. Entry points: ``python launcher.py view`` and ``python launcher.py report``.
"""
