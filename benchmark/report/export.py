"""``dapbench export OUT``: the results as a dataset in the field's form, readable without dapbench.

Four Parquet tables and a dataset card whose YAML header the Hugging Face Hub reads, so the folder loads with
``pandas.read_parquet`` and ``datasets.load_dataset("parquet", data_files=...)`` and can be pushed to the Hub as it is:

- ``runs.parquet``: one row per record (:func:`runs_table`): identity, setting and every leaderboard metric;
- ``stages.parquet``: one row per record x stage x held-out set (:func:`stages_table`): the held-out loss;
- ``curves.parquet``: one row per record x stage x held-out set x measured update (:func:`curves_table`): the
  held-out loss while the stage trains, for runs with continual evaluation (``dap.eval_every``);
- ``end_tasks.parquet``: one row per record x protocol x stage x end task (:func:`end_tasks_table`): accuracy,
  macro-F1, test examples, the classes in the test set and the classes the classifier predicted, the majority class's
  macro-F1 and whether the cell measures the backbone.

Records scored by lm-evaluation-harness (protocol ``lm_eval``) also get lm-eval's own results JSON per stage under
``lm_eval/`` (its ``results`` block, ``acc,none`` as the harness reported it: dapbench checks at run time that the
harness's accuracy is the one of its per-sample log-likelihoods, which the record keeps as predictions).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pandas as pd

from benchmark.errors import DapbenchError
from benchmark.io import atomic_write_bytes, atomic_write_text, path_inside
from benchmark.metrics import GAP_SUMMARY, majority_macro_f1, record_backbone_flags, stability_gap
from benchmark.report.words import say

TABLES = ("runs", "stages", "curves", "end_tasks")
"""The exported tables, each ``<name>.parquet``."""


def column_name(title: str) -> str:
    """A leaderboard column title as a dataset column name: ``final macro-F1`` -> ``final_macro_f1``."""
    return re.sub(r"[^a-z0-9]+", "_", title.lower()).strip("_")


def runs_table(records: list[dict]) -> pd.DataFrame:
    """One row per record: run id, profile, group key, method, method label, seed, sequence, model, protocol,
    environment, timing and every summary metric of the leaderboard (column names in snake case)."""
    from benchmark.report.frame import leaderboard_frame

    frame = leaderboard_frame(records).set_index("run_id")
    rows = []
    for record in records:
        metrics = frame.loc[record["run_id"]]
        config, environment = record["config"], record["environment"]
        row = {
            "run_id": record["run_id"],
            "profile": record["profile"],
            "group": metrics["group"],
            "method": record["method"],
            "method_label": record["method_label"],
            "seed": record["seed"],
            "sequence": config.get("sequence"),
            "domains": list(record["sequence"]),
            "model": config.get("model"),
            "model_kind": record.get("model_kind"),
            "protocol": config["finetune"]["protocol"],
            "dap_steps": config["dap"]["steps"],
            "dap_batch_size": config["dap"]["batch_size"],
            "dap_seq_len": config["dap"]["seq_len"],
            "device": environment.get("device_name") or environment.get("device"),
            "torch_threads": environment.get("torch_threads"),
            "git_commit": environment.get("git_commit"),
            "wall_seconds": record["timing"]["wall_seconds"],
        }
        skip = {"group", "method", "seed", "order", "pair"}
        row |= {column_name(key): _plain(value) for key, value in metrics.items() if key not in skip}
        gap = stability_gap(record) or {}  # a run without curves has every column, empty
        row |= {f"gap_{key}": gap.get(key) for key in GAP_SUMMARY}
        rows.append(row)
    return pd.DataFrame(rows)


def stages_table(records: list[dict]) -> pd.DataFrame:
    """One row per record x stage x held-out set: stage -1 is the base model, stage t the model after domain t
    (a stage without a model, as in joint training, has no rows)."""
    rows = []
    for record in records:
        losses = record["lm_loss"]
        stages = [("base", losses["base"]), *zip(record["sequence"], losses["after_domain"], strict=True)]
        for t, (domain, row) in enumerate(stages, start=-1):
            for name, value in (row or {}).items():
                rows.append({"run_id": record["run_id"], "stage": t, "after": domain, "eval_set": name, "loss": value})
    return pd.DataFrame(rows, columns=["run_id", "stage", "after", "eval_set", "loss"])


def curves_table(records: list[dict]) -> pd.DataFrame:
    """One row per record x stage x measured update x held-out set of a run with continual evaluation
    (``dap.eval_every``): the loss on the set's curve subset after ``update`` updates of domain ``stage``."""
    rows = []
    for record in records:
        for t, domain in enumerate(record["domains"]):
            curve = domain.get("curve") or {"steps": [], "losses": {}}
            for name, losses in curve["losses"].items():
                for update, loss in zip(curve["steps"], losses, strict=True):
                    row = {"run_id": record["run_id"], "stage": t, "during": domain["domain"], "update": update}
                    rows.append({**row, "eval_set": name, "loss": loss})
    return pd.DataFrame(rows, columns=["run_id", "stage", "during", "update", "eval_set", "loss"])


def end_tasks_table(records: list[dict]) -> pd.DataFrame:
    """One row per record x protocol x stage x end task that was scored: accuracy and macro-F1 (fractions), the test
    examples scored, the task's classes, the classes present in its test labels and those the classifier predicted
    (how many, and which), and whether the cell measures the backbone at all (it predicts at least half of the
    test set's classes)."""
    rows = []
    for record in records:
        labels = record.get("test_labels") or {}
        blocks = {record["config"]["finetune"]["protocol"]: (record, None)}
        blocks.update({name: (cells, name) for name, cells in (record.get("end_tasks_beside") or {}).items()})
        for protocol, (cells, beside) in blocks.items():
            rows += _cells(record, protocol, cells, record_backbone_flags(record, beside), labels)
    return pd.DataFrame(rows, columns=END_TASK_COLUMNS)


END_TASK_COLUMNS = (
    "run_id protocol stage after task accuracy macro_f1 test_examples classes classes_in_test classes_predicted"
    " predicted_classes fine_tunes majority_macro_f1 measures_backbone"
).split()
"""The columns of ``end_tasks.parquet``, in order."""


def _cells(record: dict, protocol: str, block: dict, flags: dict[str, str], labels: dict) -> list[dict]:
    """The rows of one protocol's cells (``block``: the record, or its block beside; ``flags``: its backbone flags)."""
    matrices, predictions, later = (
        block["matrices"],
        block.get("predictions") or {},
        block.get("seed_predictions") or {},
    )
    rows = []
    for t, domain in enumerate(record["sequence"]):
        for k, task in enumerate(record["end_tasks"]):
            acc, f1 = matrices["acc"][t][k], matrices["macro_f1"][t][k]
            if acc is None:
                continue
            predicted = predictions.get(f"{t}/{k}")
            test = labels.get(task, {})
            rows.append(
                {
                    "run_id": record["run_id"],
                    "protocol": protocol,
                    "stage": t,
                    "after": domain,
                    "task": task,
                    "accuracy": acc,
                    "macro_f1": f1,
                    "test_examples": len(predicted) if predicted is not None else None,
                    "classes": test.get("classes"),
                    "classes_in_test": len(set(test["labels"])) if "labels" in test else None,
                    "classes_predicted": len(set(predicted)) if predicted is not None else None,
                    "predicted_classes": sorted(set(predicted)) if predicted is not None else None,
                    "fine_tunes": 1 + len(later.get(f"{t}/{k}", [])),
                    "majority_macro_f1": majority_macro_f1(test["labels"], test["classes"]) if test else None,
                    "measures_backbone": None if predicted is None else f"{t}/{k}" not in flags,
                }
            )
    return rows


def lm_eval_results(record: dict) -> dict[str, dict]:
    """lm-evaluation-harness's results JSON for each stage of an ``lm_eval`` record: ``after<t>`` -> its dict."""
    out = {}
    for t, domain in enumerate(record["sequence"]):
        results, samples = {}, {}
        for k, task in enumerate(record["end_tasks"]):
            acc = record["matrices"]["acc"][t][k]
            if acc is None:
                continue
            predicted = (record.get("predictions") or {}).get(f"{t}/{k}") or []
            results[task] = {"alias": task, "acc,none": acc, "acc_stderr,none": "N/A"}
            samples[task] = {"original": len(predicted), "effective": len(predicted)}
        if results:
            out[f"after{t}"] = {
                "results": results,
                "n-samples": samples,
                "config": {"model": record["config"].get("model"), "num_fewshot": 0, "after_domain": domain},
                "dapbench": {"run_id": record["run_id"], "stage": t, "macro_f1 (dapbench)": _macro(record, t)},
            }
    return out


def _macro(record: dict, t: int) -> dict[str, float | None]:
    return dict(zip(record["end_tasks"], record["matrices"]["macro_f1"][t], strict=True))


def _plain(value: Any) -> Any:
    """A pandas cell as a plain Python value (NaN as None)."""
    if isinstance(value, float) and value != value:
        return None
    return value.item() if hasattr(value, "item") else value


def export_results(records: list[dict], out: str | Path) -> dict[str, int]:
    """Write the dataset of ``records`` under ``out`` (created if needed; only files of the dataset are written, each
    atomically); return the rows per table."""
    if not records:
        raise DapbenchError("no records to export", "pass the folder that holds results/ (--output-dir)")
    folder = Path(out)
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise DapbenchError(f"{folder} is not a folder of its own", "pass a new folder to export into")
    tables = {"runs": runs_table(records), "stages": stages_table(records), "curves": curves_table(records)}
    tables["end_tasks"] = end_tasks_table(records)
    for name, frame in tables.items():
        data = frame.to_parquet(index=False, compression="zstd")
        atomic_write_bytes(path_inside(folder, f"{name}.parquet"), lambda tmp, data=data: tmp.write_bytes(data))
    for record in records:
        if record["config"]["finetune"]["protocol"] == "lm_eval":
            for stage, results in lm_eval_results(record).items():
                target = path_inside(folder, "lm_eval", f"{record['run_id']}-{stage}.json")
                atomic_write_text(target, json.dumps(results, indent=2) + "\n")
    atomic_write_text(path_inside(folder, "README.md"), dataset_card(tables))
    return {name: len(frame) for name, frame in tables.items()}


def dataset_card(tables: dict[str, pd.DataFrame]) -> str:
    """The dataset card: the YAML header the Hub reads (one config per table) and what each table holds."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        __version__ = version("dapbench")
    except PackageNotFoundError:  # a checkout used without installing it
        __version__ = "unknown"
    return say("dataset_card.md.j2", "card", {name: tables[name] for name in TABLES}, __version__)
