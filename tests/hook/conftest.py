"""The hook's tier: libvgpu.so over the simulated GPU, driven by the small C
clients in tests/c (built once per session by `cbuild`)."""

from support.hook import cbuild, client_factory, clients, sim  # noqa: F401
