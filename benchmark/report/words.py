"""The report's words: Markdown sentences rendered from typed findings by the Jinja2 templates in ``templates/``.

A reading computes what it finds (which rows, which numbers, which verdicts) as typed values; a template says it in
English. So a maintainer rewords a sentence in its template without touching a statistic, and a reading's logic is
tested apart from its prose. The templates are Markdown fragments, one macro per sentence or line, each written on one
template line: ``{%- -%}`` strips the whitespace around every tag, so a macro's output is exactly its line.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

from benchmark.report.escape import code, text

TEMPLATES = Path(__file__).with_name("templates")
"""The folder of the report's Markdown templates."""


def names(items, quote: bool = True) -> str:
    """``a``, ``a and b``, ``a, b and c`` (each in code spans where ``quote``)."""
    shown = [code(item) if quote else str(item) for item in items]
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} and {shown[-1]}"


def verb(items, one: str, many: str) -> str:
    """The verb that agrees with a list of ``items`` as its subject."""
    return one if len(items) == 1 else many


def plural(count: int, word: str) -> str:
    """``1 row``, ``3 rows``."""
    return f"{count} {word}{'' if count == 1 else 's'}"


@functools.cache
def _environment():
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=False,  # Markdown: every record string passes through the code or text filter instead
        undefined=jinja2.StrictUndefined,
    )
    env.filters.update(code=code, text=text, names=names, fmt=format, plural=plural)
    env.globals.update(verb=verb, abs=abs, isnan=math.isnan)
    return env


def say(template: str, macro: str, *args, **kwargs) -> str:
    """The Markdown that ``macro`` of ``template`` (a file of ``templates/``) renders from the findings given."""
    return str(getattr(_environment().get_template(template).module, macro)(*args, **kwargs))


def say_lines(template: str, macro: str, *args, **kwargs) -> list[str]:
    """:func:`say` of a macro that renders several lines (a heading and its paragraph, a table's header), as lines."""
    return say(template, macro, *args, **kwargs).split("\n")
