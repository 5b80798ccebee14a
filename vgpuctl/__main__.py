"""The `vgpuctl` command's entry point (also `python -m vgpuctl`).

Two commands that scripts run often go around click: `vgpuctl run ...` (to
vgpuctl.launch) and `vgpuctl ps --json`. Neither imports click nor the other
commands: Python's import time is most of what they cost (see
bench/run_overhead.py). Everything else, and anything those two fast paths
don't recognise (--help, a typo), goes through the click CLI (vgpuctl.cli),
which gives the same results.
"""

from __future__ import annotations

import sys


def ps_json(argv: list[str]) -> int | None:
    """`vgpuctl ps --json [--all] [--socket PATH]`, or None when argv is
    anything else."""
    want_json = all_jobs = False
    socket_path = None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--json":
            want_json = True
        elif a in ("-a", "--all"):
            all_jobs = True
        elif a == "--socket" and i + 1 < len(argv):
            i += 1
            socket_path = argv[i]
        elif a.startswith("--socket="):
            socket_path = a.partition("=")[2]
        else:
            return None
        i += 1
    if not want_json:
        return None
    import json

    from vgpuctl.client.connection import connect

    with connect(socket_path) as cl:
        data = cl.call("ps", all=all_jobs or None)
    out = {"v": data.get("v", 1), "daemon": data.get("daemon"), "gpus": data.get("gpus", []),
           "jobs": data.get("jobs", [])}
    sys.stdout.write(json.dumps(out, indent=1) + "\n")
    sys.stdout.flush()
    return 0


def main() -> None:
    args = sys.argv[1:]
    fast = {"run": "launch", "ps": "ps"}.get(args[0] if args else "")
    if fast is not None:
        from vgpuctl.errors import VgpuError

        try:
            if fast == "launch":
                from vgpuctl.client.launch import fast_main

                rc = fast_main(args[1:])
            else:
                rc = ps_json(args[1:])
        except VgpuError as e:
            print(f"vgpuctl: error: {e}", file=sys.stderr)
            sys.exit(e.exit_code)
        except KeyboardInterrupt:
            sys.exit(130)
        except BrokenPipeError:
            sys.exit(141)
        if rc is not None:
            sys.exit(rc)
    from vgpuctl.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
