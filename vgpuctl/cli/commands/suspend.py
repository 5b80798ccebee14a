"""``vgpuctl suspend`` and ``vgpuctl resume``: a job's processes
checkpointed by the driver (its GPU memory given back), and restored, on
the same GPU or another (docs/suspend.md)."""

from __future__ import annotations

import click

from vgpuctl.core import nodeview

# A suspend or resume copies the job's memory between the GPU and host
# memory: a few seconds for tens of GiB, more on a slow bus.
REPLY_S = 900.0


def outcome_line(out: dict) -> str:
    """What became of one job: "job 12: moved to GPU 0", "job 12: resumed
    on GPU 1", "job 12: suspended (why)" (suspend, resume and drain)."""
    jid = out.get("job", "?")
    action = out.get("action", "done")
    gpu = out.get("gpu")
    where = ("" if gpu is None or action == "failed" else
             f" to GPU {gpu}" if action == "moved" else f" on GPU {gpu}")
    detail = f" ({out['detail']})" if out.get("detail") else ""
    return f"job {jid}: {action}{where}{detail}"


def _line(reply: dict) -> str:
    return outcome_line(reply.get("outcome") or {})


@click.command()
@click.argument("jobs", nargs=-1, required=True, metavar="JOB")
@click.option("--socket", "socket_path", metavar="PATH", help="The daemon's socket.")
def suspend(jobs: tuple[str, ...], socket_path: str | None) -> int | None:
    """Suspend each JOB: every process of it is stopped by the driver, its
    GPU memory is copied to host memory and the GPU's memory given back (all
    of the job's processes, or none: a failure part-way undoes the rest).
    Its CUDA calls wait meanwhile; `vgpuctl resume` takes it back.

    A JOB is an id, or a name (or a shell pattern such as 'train-*') that
    stands for every running job of yours with that name. Needs NVIDIA
    driver R570 or newer.
    """
    from vgpuctl.cli.commands.set import each_job, select_jobs
    from vgpuctl.client.connection import connect

    nodeview.check_job_args(jobs)
    with connect(socket_path, timeout=REPLY_S) as cl:
        ids = [i for _, found in select_jobs(cl, jobs) for i in found]
        return each_job(ids, lambda jid: click.echo(_line(cl.call("suspend", job=jid))))


@click.command()
@click.argument("job", metavar="JOB")
@click.option("--gpu", metavar="GPU", help="Resume on this GPU (an index or a UUID): a move "
              "when it is another one (driver R580 or newer).")
@click.option("--socket", "socket_path", metavar="PATH", help="The daemon's socket.")
def resume(job: str, gpu: str | None, socket_path: str | None) -> int | None:
    """Resume a suspended JOB: its memory goes back to a GPU, at the same
    addresses, and its processes go on. Without --gpu it goes back to its
    own GPU when that has room, else to the GPU with the most room; it is
    refused, and stays suspended, when none has.
    """
    from vgpuctl.cli.commands.set import select_jobs
    from vgpuctl.client.connection import connect
    from vgpuctl.errors import UsageError

    nodeview.check_job_args((job,))
    with connect(socket_path, timeout=REPLY_S) as cl:
        ids = [i for _, found in select_jobs(cl, (job,)) for i in found]
        if len(ids) != 1:
            raise UsageError(f"{job} names {len(ids)} jobs: resume takes one")
        click.echo(_line(cl.call("resume", job=ids[0], gpu=gpu)))
    return None
