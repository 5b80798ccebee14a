"""The pure core: sizes, placement, the turns, the wire
protocol, the accounting integrator, report arithmetic and config checking.

Rule (checked by tests/unit/test_layers.py): no I/O, no clock, no
environment, no logging. Modules here import only the standard library's
pure parts, each other and vgpuctl.errors; time and data come in as
arguments, results go out as values.
"""
