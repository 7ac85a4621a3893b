"""Test suite (mirrors the sources)."""
