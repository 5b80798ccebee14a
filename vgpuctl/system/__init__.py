"""Adapters to the machine: where files live (paths), the config file,
NVML, the shared region, the compiled parts, the simulated GPU, sd_notify
and file writing."""
