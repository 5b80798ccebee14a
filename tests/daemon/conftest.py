"""The daemon's tier: a real `vgpuctl daemon` over the simulated GPU in a
private directory (the `daemon` and `daemon_factory` fixtures of
tests/conftest.py), or its parts driven through requests."""
