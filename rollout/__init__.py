"""The launcher's insides, one subpackage per layer (docs/architecture.md). ``launcher.py`` is only
the CLI's entry point."""
