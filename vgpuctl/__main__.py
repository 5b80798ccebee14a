"""The `vgpuctl` command's entry point (also `python -m vgpuctl`).

`vgpuctl run ...` goes straight to vgpuctl.launch, which imports neither
click nor the other commands: Python's import time is most of what `run`
adds to a job's start. Everything else, and `run --help`, goes through the
click CLI (vgpuctl.cli).
"""

from __future__ import annotations

import sys


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["run"]:
        from .errors import VgpuError

        try:
            from .launch import fast_main

            rc = fast_main(args[1:])
        except VgpuError as e:
            print(f"vgpuctl: error: {e}", file=sys.stderr)
            sys.exit(e.exit_code)
        except KeyboardInterrupt:
            sys.exit(130)
        except BrokenPipeError:
            sys.exit(141)
        if rc is not None:
            sys.exit(rc)
    from .cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
