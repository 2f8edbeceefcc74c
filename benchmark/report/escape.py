"""Record strings made safe to show: a ``|`` cannot break a Markdown table, HTML and terminal escape bytes (ANSI,
OSC) are never written as they are."""

from __future__ import annotations

import re

CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
"""C0 and C1 control characters: ANSI and OSC escape sequences start with them."""


def printable(value: object) -> str:
    """``value`` as text without control characters (each becomes ``?``): safe on a terminal."""
    return CONTROL.sub("?", str(value))


def text(value: object) -> str:
    """``value`` as Markdown text: control characters removed, HTML and table syntax escaped."""
    escaped = printable(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return escaped.replace("|", "\\|").replace("`", "'").replace("*", "\\*").replace("_", "\\_").replace("[", "\\[")


def code(value: object) -> str:
    """``value`` as inline code: control characters removed, backticks dropped, ``|`` escaped for tables."""
    return "`" + printable(value).replace("`", "'").replace("|", "\\|") + "`"


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
"""What makes a spreadsheet read a cell as a formula (OWASP's list for CSV injection)."""


def spreadsheet_cell(value: object) -> object:
    """``value`` as a CSV cell a spreadsheet shows as text: a string starting like a formula gets a leading ``'``
    (numbers, None and other strings as they are)."""
    if isinstance(value, str) and value.startswith(FORMULA_START):
        return "'" + value
    return value
