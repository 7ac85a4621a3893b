"""Tests of the bundled envs (env/)."""
