"""The hostile tier: what a job's user can do to the daemon, to other jobs
and to the hook from inside a job (rewrite or truncate its usage region,
forge a region, set the hook's environment, open connections), each re-run
as an attack and checked against what must still hold. docs/security.md
says what holds and what does not.

The daemon runs as root here and the job's side too; the tests that need a
second uid say so and skip where the interpreter can't take it."""

from support.hook import cbuild, client_factory, clients, sim  # noqa: F401
