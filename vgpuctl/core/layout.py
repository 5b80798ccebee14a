"""Fitting a table to a terminal's width: pure, so that the unit tests can
lay out any table at any width. (NamedTuples rather than dataclasses: `ps
--json`, which scripts call often, loads this module, and they are cheaper
to define.)

A table is its columns (``Column``) and rows of ``Cell``s. Given a width,
``fit`` applies the table's plan, a list of steps taken in order only while
the table is still too wide:

- ``Short(key)``: the column shows its cells' short forms (a GPU UUID
  ``GPU-d1d7f5c3`` rather than all 40 characters);
- ``Cut(key, least)``: the column gives up width, down to ``least``
  characters; its cells are cut with an ellipsis;
- ``Drop(key)``: the column is left out.

Columns no step names are always kept whole (a job's id, its GPU, its
memory). With no width (stdout is not a terminal) nothing is shortened:
every column is as wide as its widest cell.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

GAP = 2         # spaces between columns
ELLIPSIS = "…"


class Column(NamedTuple):
    key: str
    header: str
    right: bool = False           # right-aligned (numbers)


class Cell(NamedTuple):
    text: str
    short: str | None = None      # the compact form, for a Short step
    style: str = ""               # a rich style name, for terminals


class Short(NamedTuple):
    key: str


class Cut(NamedTuple):
    key: str
    least: int


class Drop(NamedTuple):
    key: str


Step = Short | Cut | Drop


class Layout(NamedTuple):
    """What ``fit`` decided: the columns shown, in order, with their widths,
    and which of them show their short forms."""

    columns: tuple[Column, ...]
    widths: tuple[int, ...]
    short: frozenset[str] = frozenset()

    @property
    def width(self) -> int:
        return sum(self.widths) + GAP * max(0, len(self.widths) - 1)


# Control characters (C0, DEL, C1) in what a job's user chose (its name, its
# command) would break a row or, on a terminal, act as escape sequences.
_CONTROLS = {c: "?" for c in [*range(0x20), *range(0x7f, 0xa0)]}


def cell_text(cell: Cell, short: bool) -> str:
    """What a cell shows: its short form when asked, control characters as ?."""
    text = cell.short if short and cell.short is not None else cell.text
    return text.translate(_CONTROLS)


def _natural(col: int, columns: Sequence[Column], rows: Sequence[Sequence[Cell]],
             short: bool, header: bool) -> int:
    w = len(columns[col].header) if header else 0
    for r in rows:
        w = max(w, len(cell_text(r[col], short)))
    return w


def fit(columns: Sequence[Column], rows: Sequence[Sequence[Cell]], width: int | None,
        plan: Sequence[Step] = (), header: bool = True) -> Layout:
    """The layout of the table in ``width`` characters (None: no limit).
    When every step is taken and the table is still too wide, it is left
    wider than ``width`` (the terminal crops it): the columns no step names
    are never shortened."""
    keys = [c.key for c in columns]
    shown = list(range(len(columns)))
    short: set[str] = set()
    widths = [_natural(i, columns, rows, False, header) for i in range(len(columns))]
    cut: list[int] = []

    def total() -> int:
        return sum(widths[i] for i in shown) + GAP * max(0, len(shown) - 1)

    if width is not None:
        for step in plan:
            if total() <= width:
                break
            if step.key not in keys:
                continue
            i = keys.index(step.key)
            if i not in shown:
                continue
            if isinstance(step, Short):
                short.add(step.key)
                widths[i] = _natural(i, columns, rows, True, header)
            elif isinstance(step, Cut):
                least = min(widths[i], max(step.least, 1))
                widths[i] = max(least, widths[i] - (total() - width))
                cut.append(i)
            else:
                shown.remove(i)
        # A column dropped later may have left room: give it back to the cut ones.
        for i in cut:
            if i in shown and total() < width:
                full = _natural(i, columns, rows, columns[i].key in short, header)
                widths[i] = min(full, widths[i] + width - total())
    return Layout(columns=tuple(columns[i] for i in shown),
                  widths=tuple(widths[i] for i in shown), short=frozenset(short))


def clip(text: str, width: int) -> str:
    """text in at most width characters, its end cut to an ellipsis."""
    if len(text) <= width:
        return text
    return text[:max(0, width - 1)] + ELLIPSIS if width > 0 else ""


def lines(layout: Layout, all_columns: Sequence[Column], rows: Sequence[Sequence[Cell]],
          header: bool = True) -> list[list[tuple[str, str]]]:
    """The table's lines, each a list of (text, style) pieces that join to
    the line (header first, in style "bold"). No trailing spaces."""
    index = {c.key: i for i, c in enumerate(all_columns)}
    out: list[list[tuple[str, str]]] = []
    grid: list[tuple[list[str], list[str]]] = []
    if header:
        grid.append(([c.header for c in layout.columns], ["bold"] * len(layout.columns)))
    for r in rows:
        cells = [r[index[c.key]] for c in layout.columns]
        grid.append(([cell_text(c, col.key in layout.short)
                      for c, col in zip(cells, layout.columns, strict=True)],
                     [c.style for c in cells]))
    last = len(layout.columns) - 1
    for texts, styles in grid:
        pieces: list[tuple[str, str]] = []
        for i, (col, w) in enumerate(zip(layout.columns, layout.widths, strict=True)):
            t = clip(texts[i], w)
            pad = " " * (w - len(t))
            if i:
                pieces.append((" " * GAP, ""))
            if col.right:
                pieces += [(pad, ""), (t, styles[i])]
            else:
                pieces.append((t, styles[i]))
                if i != last:
                    pieces.append((pad, ""))
        while pieces and not pieces[-1][0].strip():
            pieces.pop()
        out.append(pieces)
    return out


def plain(pieces_lines: Sequence[Sequence[tuple[str, str]]]) -> str:
    """The lines as text, without styles."""
    return "".join("".join(t for t, _ in ln) + "\n" for ln in pieces_lines)
