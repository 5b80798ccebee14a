"""vgpuctl: share one GPU among many jobs, each with a memory limit and a compute share."""

__version__ = "0.5.0"
