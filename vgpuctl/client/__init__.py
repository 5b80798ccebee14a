"""Talking to the daemon (connection) and running a command as a job
(launch)."""
