"""``launcher.py audit``: scripted hostile agents run against a benchmark's own graders (docs/audit.md)."""
