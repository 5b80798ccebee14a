"""The `vgpuctl` command's entry point (also `python -m vgpuctl`): the click CLI."""

from vgpuctl.cli import main

if __name__ == "__main__":
    main()
