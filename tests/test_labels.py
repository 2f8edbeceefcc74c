"""Leaderboard row labels (``benchmark.labels``): the one writer and reader of ``method[key=value,...]`` that the run,
the report and the CLI share."""

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmark.labels import is_row_label, join_label, label_method, option_pairs, split_label, well_formed
from benchmark.report.reading import option_parents

ROOT = Path(__file__).resolve().parents[1]
NAME = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_.0123456789", min_size=1, max_size=12)
OPTION = st.builds(lambda key, value: f"{key}={value}", NAME, NAME)


@given(NAME.filter(lambda n: "." not in n), st.lists(OPTION, max_size=4))
def test_a_label_reads_back_as_the_method_and_options_it_was_written_from(method, options):
    label = join_label(method, options)
    assert split_label(label) == (method, options)
    assert label_method(label) == method
    assert well_formed(label)
    assert is_row_label(label) == bool(options)
    assert [f"{key}={value}" for key, value in option_pairs(label)] == options


def test_empty_option_parts_are_left_out_so_a_method_at_its_defaults_is_its_bare_name():
    assert join_label("ncl", ["", ""]) == "ncl"
    assert join_label("ncl", ["", "replay.general=0.05"]) == "ncl[replay.general=0.05]"


def test_a_text_not_of_a_labels_form_is_no_row_label():
    assert not well_formed("a[b]c")
    assert not well_formed("a,b")
    assert not is_row_label("ncl[]")
    assert split_label("a[b") == ("a[b", [])


def test_option_parents_drop_one_option_each():
    assert option_parents("das[a=1,b=2]") == ["das[b=2]", "das[a=1]"]
    assert option_parents("das[a=1]") == ["das"]


def test_every_committed_records_label_reads_back_as_written():
    """The committed records' labels (written by the runs through :func:`join_label`) all have the form the report
    reads, and split into their recorded method."""
    summaries = [p for p in (ROOT / "results").rglob("*.json") if "bench" not in p.parts and "report" not in p.parts]
    labelled = [json.loads(p.read_text()) for p in summaries]
    labelled = [r for r in labelled if isinstance(r, dict) and "method_label" in r]
    if not labelled:
        pytest.skip("no committed records")
    for record in labelled:
        label = record["method_label"]
        assert well_formed(label), label
        assert join_label(*split_label(label)) == label
        assert label_method(label) == record["method"], label
