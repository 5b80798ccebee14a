"""The hostile tier: the attacks and faults of issue 11 re-run as a job's
user (or a stranger on the node) would run them, against a real daemon on
the simulated GPU (the `daemon` and `daemon_factory` fixtures of
tests/conftest.py)."""
