"""CI key-number check: re-run the ``ci`` profile and compare every number with the committed records.

Slow (a few minutes): ``.ci/run`` calls it explicitly (``python -m pytest -m slow tests/test_key_numbers.py``).
The tolerance (``benchmark.records.reproduce.CI_TOLERANCE``) and how it was measured are documented there.
"""

from pathlib import Path

import pytest
from conftest import requires_shared_data

from benchmark.api import continual_run
from benchmark.data.inputs import prepare_data
from benchmark.records.reproduce import CI_TOLERANCE, check_data, compare_records, reproduction_config
from benchmark.records.store import load_record

COMMITTED = Path(__file__).resolve().parents[1] / "results" / "ci"


def committed_records() -> list[dict]:
    return [load_record(path) for path in sorted(COMMITTED.glob("*.json"))]  # whole: summary and sidecars


def test_committed_ci_records_cover_ncl_one_and_das():
    assert sorted(r["method"] for r in committed_records()) == ["das", "ncl", "one"]


@pytest.mark.slow
@requires_shared_data()
def test_ci_profile_reproduces_every_committed_number(tmp_path):
    records = committed_records()
    config = reproduction_config(records[0], tmp_path, {})
    data = prepare_data(config)
    failures = []
    for record in records:
        check_data(record, data.checksums)
        actual = continual_run(config, data, record["method"], record["seed"], show_progress=False).execute()
        failures += [f"{record['method']}: {m}" for m in compare_records(record, actual, CI_TOLERANCE)]
    assert not failures, "\n".join(failures)
