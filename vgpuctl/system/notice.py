"""The daemon's poke to a job's `vgpuctl run` when the job was suspended,
resumed or moved (by a preemption, a drain, another terminal): the run asks
the daemon for its job and tells its terminal (vgpuctl.client.launch).

A realtime signal, which `run` never forwards to its command. Anyone may
send it to their own `run`; all it does is make `run` ask."""

from __future__ import annotations

import signal

NOTICE_SIGNAL = signal.SIGRTMIN + 5
