"""One module per command. vgpuctl.cli.COMMANDS names them; each is
imported only when its command runs (or --help lists them), so a module
here imports click and little else at its top: the heavy parts (rich,
pynvml, asyncio, sqlite3) load inside the command that needs them."""
