"""``dapbench versus`` (issue #89): one row against every other row of its group, through the leaderboard's own
calibrated comparison with that row as the reference."""

import pytest

from benchmark.cli import main
from benchmark.errors import DapbenchError
from benchmark.io import atomic_write_json
from benchmark.report.groups import group_records
from benchmark.report.reading import column_of
from benchmark.report.versus import versus_markdown
from benchmark.report.writer import group_statistics


def test_a_row_reads_against_every_other_row_with_the_signs_turned(report_records):
    (group,), _ = group_records(report_records)
    stats = group_statistics(group)
    lines = versus_markdown([group], "ncl", lambda _: stats)
    table = [line for line in lines if line.startswith("| `")]
    assert [line.split(" | ")[0] for line in table] == ["| `das`", "| `none`"]
    for title, position in (("forgetting", 2), ("general rise", 3), ("plasticity", 4)):
        for comparison in stats.comparisons("ncl", column_of(title)):  # the other row minus ncl
            row = next(line for line in table if line.startswith(f"| `{comparison.label}` |"))
            cell = row.split(" | ")[position]
            assert f"{-comparison.mean:+.3f}" in cell  # ncl minus the other row
            assert ("q = " in cell) == comparison.resolved() and ("80% power" in cell) != comparison.resolved()
    assert "Benjamini-Hochberg over the 2 rows per metric" in "\n".join(lines)


def test_the_command_prints_the_tables_and_names_an_unknown_row(report_records, tmp_path, capsys):
    for record in report_records:
        atomic_write_json(tmp_path / "results" / record["profile"] / f"{record['run_id']}.json", record)
    assert main(["versus", "das", "--output-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "## `das` against every row of group" in out and "| `ncl` | 3 |" in out and "| `none` | 3 |" in out
    assert main(["versus", "dsa", "--output-dir", str(tmp_path)]) == 2
    assert "no record of the row 'dsa'" in capsys.readouterr().err
    (group,), _ = group_records(report_records)
    with pytest.raises(DapbenchError, match="did you mean 'das'"):
        versus_markdown([group], "dsa", group_statistics)
