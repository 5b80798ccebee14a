"""The compute governor: NVML per-process utilization in (sampler), refill
rates for the hook's token buckets out (compute), with the arithmetic in
vgpuctl.core.controller."""
