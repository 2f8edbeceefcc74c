"""Issue #87: the report's readings find, its templates say. The short answer's and the budget ladder's words live in
``benchmark/report/templates/``; the modules that compute them hold no sentence of their own."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import jinja2
import pytest

from benchmark.report import answer, words
from benchmark.report.ladder import TauResult

REPORT = Path(words.__file__).parent
FINDING_MODULES = (
    "answer.py",
    "beside.py",
    "end_task_reading.py",
    "frontier.py",
    "group_text.py",
    "ladder.py",
    "law.py",
    "markdown.py",
    "matched.py",
    "plots.py",
    "reading.py",
    "stability_gap.py",
    "summary.py",
    "training_reading.py",
    "versus.py",
)
"""Readings and the leaderboard's, plots' and terminal's renderers, whose words live in templates: they may hold
names, short labels and their errors, never a sentence."""


def _prose_literals(path: Path) -> list[str]:
    """String literals of four words or more that are not docstrings (f-string pieces count) nor an error's message
    (a named error says what is wrong and how to fix it where it is raised)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    raised = {id(node) for r in ast.walk(tree) if isinstance(r, ast.Raise) for node in ast.walk(r)}
    # a label declared as a module constant (a key of a table as much as words) is named and documented where it is
    labels = {
        id(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        and all(isinstance(t, ast.Name) and t.id.isupper() for t in node.targets)
        and isinstance(node.value, ast.Constant)
    }
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    # a constant's docstring (the string right after an assignment) documents it, it says nothing in the report
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            for first, second in zip(body, body[1:], strict=False):
                if isinstance(first, ast.Assign | ast.AnnAssign) and isinstance(second, ast.Expr):
                    docstrings.add(id(second.value))
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings | raised | labels
        and len(node.value.split()) >= 4
    ]


@pytest.mark.parametrize("module", FINDING_MODULES)
def test_a_reading_whose_words_are_templated_holds_no_sentence(module):
    assert _prose_literals(REPORT / module) == []


def test_the_prose_check_sees_a_sentence_in_an_f_string(tmp_path):
    source = tmp_path / "reading.py"
    source.write_text('X = 1\n"""A constant."""\n\n\ndef f(n):\n    """Doc."""\n    return f"{n} rows are left out"\n')
    assert _prose_literals(source) == [" rows are left out"]


def test_lists_and_counts_read_as_english():
    assert words.names(["a"]) == "`a`"
    assert words.names(["a", "b", "c"]) == "`a`, `b` and `c`"
    assert words.names(["x | y", "z"], quote=False) == "x | y and z"
    assert words.plural(1, "row") == "1 row" and words.plural(3, "row") == "3 rows"
    assert words.verb(["a"], "beats", "beat") == "beats" and words.verb(["a", "b"], "beats", "beat") == "beat"


def test_a_template_escapes_what_a_record_says():
    budget = answer.Budget(24, 16, 64, 24576, "mini", (3,))
    line = words.say("answer.md.j2", "lead", budget, "abc", "ncl|`x`")
    assert line.startswith("At 24 DAP updates of 16 x 64 tokens per domain (24,576 tokens; group `abc`, mini profile")
    assert "(`ncl\\|'x'`)" in line and "\n" not in line


def test_a_tie_names_its_unit_beside_the_number():
    """'differences of 3.39-16.24 points with 80% power', not '... with 80% power points'."""
    assert words.say("reading.md.j2", "tie_bound", "0.015", "0.587") == (
        "their seeds resolve differences of 0.015-0.587 with 80% power"
    )
    assert words.say("reading.md.j2", "tie_bound", "3.39", "3.39", "points") == (
        "their seeds resolve differences of 3.39 points with 80% power"
    )


def test_a_finding_the_template_lacks_is_an_error_not_a_blank():
    with pytest.raises(jinja2.UndefinedError):
        words.say("answer.md.j2", "lead", object(), "abc", "ncl")


def test_seed_counts_and_tau_notes_are_worded_once():
    tau = TauResult("forgetting", (0, 2), 9, 0.39, 0.1, 0.6, p=0.14)
    clause = words.say("answer.md.j2", "screen", 24, "mini", 9, [tau])
    assert clause.endswith("is forgetting +0.39 (not distinguishable from 0).")
    settled = TauResult("plasticity", (0, 2), 9, 0.6, 0.3, 0.8, p=0.01)
    assert words.say("answer.md.j2", "screen", 24, "mini", 9, [tau, settled]).endswith(
        "is forgetting +0.39 (not distinguishable from 0) and plasticity +0.60."
    )
    assert words.say("common.md.j2", "seeds", (3,)) == "3 seeds"
    assert words.say("common.md.j2", "seeds", (1,)) == "1 seed"
    assert words.say("common.md.j2", "seeds", (3, 5)) == "3-5 seeds per row"
    nan_tau = TauResult("general rise", (0, 1), 3, math.nan, math.nan, math.nan)
    assert "| n/a (every row tied) | n/a | n/a |" in words.say(
        "ladder.md.j2", "tau_row", nan_tau, [_Rung(24), _Rung(96)]
    )


class _Rung:
    def __init__(self, steps: int):
        self.steps = steps
