"""``vgpuctl run``: run a command as a job with a memory limit and a compute share.

Every job's start pays for this module's imports: it and vgpuctl.client.launch
import nothing heavy (bench/run_overhead.py).
"""

from __future__ import annotations

import click


# Options end at `--` or at the command's first word: what follows is the
# command's, `--mem` and `-v` included. An unknown option before it is a
# usage error, not the command.
@click.command(context_settings={"allow_interspersed_args": False})
@click.option("--mem", metavar="SIZE", help="Memory limit on each of the job's GPUs: 512M, "
              "4G, 4GiB.")
@click.option("--core", metavar="PCT", help="Compute share, percent of each of the job's "
              "GPUs (1-100): promised, and counted against each GPU's (default: no promise, "
              "and no cap).")
@click.option("--gpus", "gpus", metavar="N", help="Run on N GPUs, those with the most "
              "uncommitted memory (default 1).")
@click.option("--gpu", metavar="GPU[,GPU...]", help="Pin to these GPUs: indices, UUIDs or "
              "UUID prefixes (default: the GPU with the most uncommitted memory).")
@click.option("--policy", metavar="hard|soft", help="hard: never above the share; soft: "
              "may borrow idle compute (default: the daemon's default_policy).")
@click.option("--priority", metavar="low|normal|high", help="Priority class: high "
              "(latency-sensitive: lower classes on its GPU make way while it runs), normal, "
              "low (best effort: what the others leave idle). Default: the daemon's "
              "[priority] default (normal).")
@click.option("--name", metavar="NAME", help="Job name (default: the command's name).")
@click.option("--socket", "socket_path", metavar="PATH", help="The daemon's socket.")
@click.option("-q", "--quiet", is_flag=True, help="Don't say which job id and GPU the job got.")
@click.option("-v", "--verbose", is_flag=True, help="Also say which daemon is used, and when "
              "it could not be told of the command's start or end.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run(mem: str | None, core: str | None, gpus: str | None, gpu: str | None,
        policy: str | None, priority: str | None, name: str | None, socket_path: str | None,
        quiet: bool, verbose: bool, command: tuple[str, ...]) -> int:
    """Run COMMAND as a job: vgpuctl run --mem 4G --core 30 -- python train.py

    The command keeps the terminal and stdin, receives SIGINT, SIGTERM and
    SIGHUP, and its exit code is vgpuctl's (128+N when signal N ended it). It
    sees only the GPUs it was placed on (one, unless --gpus or --gpu A,B),
    in that order; --mem and --core hold on each of them, and every process
    it starts (the ranks of torchrun or mpirun) is part of the job. When no
    daemon answers, a user daemon is started.

    Before the command starts, one line on stderr names the job's id and GPUs
    (vgpuctl: job 7 on GPU 0 (GPU-d1d7f5c3)); -q leaves it out.
    """
    from vgpuctl.cli import args, messages
    from vgpuctl.client.launch import run_job

    return run_job(command=list(command), mem=args.mem(mem), core=args.core(core),
                   policy=args.policy(policy), priority=args.priority(priority), gpu=gpu,
                   gpus=args.gpus(gpus, gpu), name=name, socket_path=socket_path,
                   verbose=verbose, quiet=quiet, note=messages.note, warn=messages.warn)
