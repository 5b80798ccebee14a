"""The hostile tier: the attacks and faults of issue 11 re-run as a hostile
user (or a failing disk) would, against a real daemon on the simulated GPU
(the `daemon` and `daemon_factory` fixtures of tests/conftest.py). Where
the attacker must be another uid than the operator's, its side runs as
nobody (uid 65534) through a system Python, and the test skips when that
can't run here."""
