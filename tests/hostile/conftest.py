"""The hostile tier: the attacks and faults of issue 11 re-run as a hostile
user (or a failing disk) would, against a real daemon on the simulated GPU
(the `daemon` and `daemon_factory` fixtures of tests/conftest.py), and
against the hook from inside a job (rewrite or truncate its usage region,
forge a region, set the hook's environment: the hook tier's fixtures). Where
the attacker must be another uid than the operator's, its side runs as
nobody (uid 65534) through a system Python, and the test skips when that
can't run here. docs/security.md says what holds and what does not."""

from support.hook import cbuild, client_factory, clients, sim  # noqa: F401
