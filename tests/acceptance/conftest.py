"""End to end across every part, checked against the simulated GPU's own
record. The tier is marked `slow` (tests/conftest.py, TIERS): `pytest -m
slow` runs it."""
