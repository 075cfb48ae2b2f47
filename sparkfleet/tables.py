"""The product's tables (plan, status, rollout, bench): one renderer, readable in a terminal and a CI log."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

CI_WIDTH = 160  # not a terminal: wide enough that no column wraps into illegibility


def console(stderr: bool = False) -> Console:
    """Rich's console on stdout (or stderr), at CI_WIDTH when the output goes to a file or a log."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else CI_WIDTH, emoji=False)


def narrow(out: Console) -> bool:
    """A console too narrow for a wide table's every column (a terminal under CI_WIDTH): it gets fewer."""
    return out.width < CI_WIDTH


def literal(value: object) -> str:
    """A string an engine, a hub or a host sent (a model id, a reply, an error), for a cell or a line that
    carries markup: printed as it is ("[/INST]" stays text, not a tag that ends a style or raises MarkupError)."""
    return escape(str(value))


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[str]], *, header: bool = True,
          justify: str = "left") -> Table:
    """Cells may carry rich markup ("[red]unhealthy[/]"): what an engine, a hub or a host sent goes through
    `literal`; `header=False` makes a key/value table."""
    out = Table(title=title, show_header=header)
    for column in columns:
        out.add_column(column, justify=justify)
    for row in rows:
        out.add_row(*row)
    return out


def print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[str]], *, header: bool = True,
                justify: str = "left", stderr: bool = False, out: Console | None = None) -> None:
    (out or console(stderr)).print(table(title, columns, rows, header=header, justify=justify))
