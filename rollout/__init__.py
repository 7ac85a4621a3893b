"""The launcher's insides: env config and dataset expansion, the scheduler, runtime backends,
evaluation and the report. ``launcher.py`` is only the CLI on top of this package."""
