"""The product's tables (plan, status, rollout, bench): one renderer, readable in a terminal and a CI log."""

from __future__ import annotations

import sys
import unicodedata
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # rich is imported where a table or a console is made: a refusal's line needs only `clean`
    from rich.console import Console, JustifyMethod
    from rich.table import Table

CI_WIDTH = 160  # not a terminal: wide enough that no column wraps into illegibility
LOG_WIDTH = 120  # a log read in an ordinary window (`make demo`'s): a table with fewer columns fits it


def console(stderr: bool = False, log_width: int | None = None) -> Console:
    """Rich's console on stdout (or stderr), at `log_width` (else CI_WIDTH) when the output goes to a file or a
    log."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else log_width or CI_WIDTH, emoji=False)


def narrow(out: Console) -> bool:
    """A console too narrow for a wide table's every column (a terminal under CI_WIDTH): it gets fewer."""
    return out.width < CI_WIDTH


TEXT_MAX = 1000  # what one untrusted value may take of a line or a cell, in characters; the rest is cut (ELLIPSIS)
ELLIPSIS = "\u2026"
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _shown(ch: str) -> str:
    """A character as a terminal should get it: itself when it only draws (a letter, a mark, a space); else its
    escape, visibly (ESC -> \\x1b, U+202E -> \\u202e), since a terminal acts on it or hides it."""
    if ch.isprintable() or unicodedata.category(ch) == "Zs":
        return ch
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def clean(value: object, limit: int | None = TEXT_MAX) -> str:
    """What an engine, a hub or a host sent (a model id, a reply, an error), for a plain line: every character a
    terminal would act on or hide (C0 with line ends and tabs, DEL, C1, bidi overrides and other format
    characters, line separators, surrogates, unassigned) shown as its escape, and at most `limit` characters
    (a longer value ends in ELLIPSIS). The one terminal sanitizer: `literal` is it for markup."""
    text = str(value)
    if limit is not None:
        text = text[:limit + 1]
    if not (text.isascii() and text.isprintable()):
        text = "".join(map(_shown, text))
    return text if limit is None or len(text) <= limit else text[:limit - 1].rstrip("\\") + ELLIPSIS


def clean_lines(text: object, limit: int | None = TEXT_MAX) -> str:
    """`clean`, line by line: a message of several lines (a refusal, a log line quoting a host) keeps its lines."""
    return "\n".join(clean(line, limit) for line in str(text).split("\n"))


def literal(value: object, limit: int | None = TEXT_MAX) -> str:
    """`clean`, for a cell or a line that carries markup: printed as it is ("[/INST]" stays text, not a tag that
    ends a style or raises MarkupError)."""
    from rich.markup import escape

    return escape(clean(value, limit))


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[str]], *, header: bool = True,
          justify: JustifyMethod = "left") -> Table:
    """Cells may carry rich markup ("[red]unhealthy[/]"): what an engine, a hub or a host sent goes through
    `literal`; `header=False` makes a key/value table."""
    from rich.table import Table

    out = Table(title=title, show_header=header)
    for column in columns:
        out.add_column(column, justify=justify)
    for row in rows:
        out.add_row(*row)
    return out


def print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[str]], *, header: bool = True,
                justify: JustifyMethod = "left", stderr: bool = False, out: Console | None = None) -> None:
    (out or console(stderr)).print(table(title, columns, rows, header=header, justify=justify))
