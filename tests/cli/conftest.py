"""The command line's tier: `vgpuctl` run as users and cron run it, in
subprocesses, its output and exit status checked."""
