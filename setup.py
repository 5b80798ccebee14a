"""Compiles the native parts (hook, simulated GPU, vgpu-burn) with gcc.

All metadata lives in pyproject.toml; this file only adds the build step.
"""

import importlib.util
import os

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))


def _native_builder():
    spec = importlib.util.spec_from_file_location(
        "vgpu_native_build", os.path.join(HERE, "libvgpu", "build.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class BuildWithNative(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            outdir = os.path.join(HERE, "vgpuctl", "_native")
        else:
            outdir = os.path.join(self.build_lib, "vgpuctl", "_native")
        _native_builder().build(outdir)


class BinaryDistribution(Distribution):
    """The wheel carries compiled libraries: tag it for the platform."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithNative}, distclass=BinaryDistribution)
