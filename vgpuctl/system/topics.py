"""The texts `vgpuctl help TOPIC` prints: the project's docs and example
files, shipped inside the package so that an installed vgpuctl (which has
no docs/ or etc/ folder) can show them.

TOPICS names each topic's source in the source tree. The build (setup.py)
copies them into the package's ``_native/doc/``; in a checkout that was not
built, the source tree's files are read. Imports only the standard library:
setup.py loads this file on its own.
"""

from __future__ import annotations

from pathlib import Path

# name: (file in the source tree, what it is)
TOPICS: dict[str, tuple[str, str]] = {
    "cli": ("docs/cli.md", "every command, `ps --json`'s fields, sizes, exit statuses"),
    "config": ("docs/config.md", "the daemon's config file: every key"),
    "config-example": ("etc/vgpu.toml", "an annotated config file to start from"),
    "operations": ("docs/operations.md",
                   "installing on a server, systemd, journald, cron reports, metrics"),
    "unit": ("etc/systemd/vgpud.service", "the systemd unit"),
    "cron": ("etc/cron.d/vgpu-report", "an example cron entry for usage reports"),
    "daemon": ("docs/daemon.md", "the daemon: paths, requests, signals, re-adoption"),
    "hook": ("docs/hook.md", "libvgpu.so, the preload library, and its environment"),
    "compute": ("docs/compute.md", "how --core shares are measured and enforced"),
    "suspend": ("docs/suspend.md",
                "suspend, resume, move and drain: the driver's checkpoint API, versions"),
    "simulator": ("docs/simulator.md", "the simulated GPU: VGPU_SIM and its knobs"),
    "pytorch": ("docs/pytorch.md",
                "from PyTorch: the limit as the GPU's size, out of memory, --core, the simulator"),
    "security": ("docs/security.md", "what a job's user can and can't do to the others"),
    "mig": ("docs/mig.md", "MIG devices shared like GPUs; vgpuctl mig makes and destroys them"),
    "slurm": ("docs/slurm.md", "Slurm's --gres=shard jobs fenced and accounted: node set-up"),
    "slurm-conf": ("etc/slurm/slurm.conf.example", "the slurm.conf lines a vgpuctl node needs"),
}

PACKAGE = Path(__file__).resolve().parent.parent
SHIPPED = PACKAGE / "_native" / "doc"
SOURCE_TREE = PACKAGE.parent


def shipped_name(topic: str) -> str:
    """The file name of a topic's copy in the package."""
    return topic + (Path(TOPICS[topic][0]).suffix or ".txt")


def copy_into(outdir: Path, source_tree: Path = SOURCE_TREE) -> list[Path]:
    """Copy every topic's text into outdir (the build's step)."""
    outdir.mkdir(parents=True, exist_ok=True)
    made = []
    for topic, (src, _) in TOPICS.items():
        dest = outdir / shipped_name(topic)
        dest.write_bytes((source_tree / src).read_bytes())
        made.append(dest)
    return made


def text(topic: str) -> str:
    """A topic's text: the package's copy, else the source tree's.
    KeyError for an unknown topic, OSError when neither is there."""
    src, _ = TOPICS[topic]
    shipped = SHIPPED / shipped_name(topic)
    try:
        return shipped.read_text()
    except FileNotFoundError:
        return (SOURCE_TREE / src).read_text()
