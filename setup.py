"""Compiles the native parts (hook, simulated GPU, vgpu-burn) with gcc.

All metadata lives in pyproject.toml; this file only adds the build step
(and copies the help topics' texts, vgpuctl/system/topics.py).
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


def _topics():
    spec = importlib.util.spec_from_file_location(
        "vgpu_topics", os.path.join(HERE, "vgpuctl", "system", "topics.py"))
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
        # `vgpuctl help TOPIC`'s texts (docs/, etc/), which an installed
        # package has no other copy of.
        from pathlib import Path

        _topics().copy_into(Path(outdir) / "doc", Path(HERE))


class BinaryDistribution(Distribution):
    """The wheel carries compiled libraries: tag it for the platform."""

    def has_ext_modules(self):
        return True


# The man page, also where man(1) looks beside a venv's or pipx's bin/.
setup(cmdclass={"build_py": BuildWithNative}, distclass=BinaryDistribution,
      data_files=[("share/man/man1", ["vgpuctl/cli/vgpuctl.1"])])
