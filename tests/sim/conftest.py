"""The simulated GPU's tier: NVIDIA's own clients (cuda-bindings,
nvidia-ml-py) and our C clients against it, in subprocesses, and the native
tree's own rules (layers, the size parser, an -O0 build)."""

from support.hook import cbuild, client_factory, clients, sim  # noqa: F401
