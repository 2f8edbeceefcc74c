"""Leaderboard groups from content: records belong together when everything that determines their numbers, except
the method, its options and the seed, is the same.

The group of a record is its identity's group payload (:meth:`benchmark.records.identity.RunIdentity.group_payload`: the
canonical configuration, the domains, the input checksums and the numerics version), so a setting added later
can never be left out of it and records made with another ``dap.lr``, other end-task files or older numerics never
share a group. The domains enter as a set: runs over several orders of one suite (``seq0..seq4``) form one group,
whose methods are compared over (order, seed) pairs. Where its methods were run over different orders (NCL and DAS
over ``seq0..seq4``, the rest over ``seq0`` only), the group is shown as one part per set of orders some method
covers, so that no table averages one method over five orders beside another over one: each part holds every method
that covers its orders, and a part of several orders only the seeds every one of its (method, order) cells has (an
orders x seeds rectangle). The part that holds every method keeps the group's key (its plots and links stay). A
record that no part shows (a seed not yet run over every order of its part) is left out as incomplete and named.
Within a group at most one record per method label, order and seed is kept: a record of older method code is
superseded by a newer one. A whole group of older numerics is superseded where a group of newer numerics has the
same settings. Superseded and incomplete records are left out and named, never an error; and a group whose records
measured the base model differently (another device or precision: the device is not part of a run's identity) is
split by evaluation, never mixed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from benchmark.protocols import protocol_short

BASE_LOSS_TOLERANCE = 1e-4
"""Nats by which the base model's held-out losses may differ between records of one group. The same held-out batches
and weights give bit-identical losses on one device; a larger difference means another evaluation (device,
precision), and such records form a group of their own."""


@dataclass
class Group:
    """The records of one leaderboard group and what they share."""

    payload: dict[str, Any]
    """The group payload (canonical config, domains, input checksums, numerics version)."""
    records: list[dict] = field(default_factory=list)
    evaluation: int = 0
    """Which of the group payload's base-model evaluations (0 unless records measured the base model differently)."""
    orders: tuple[str, ...] = ()
    """The domain orders of this part where it holds only some of the group's methods (they cover more orders than
    the others); empty for a whole group and for the part that holds every method (it keeps the group's key)."""
    title: str = ""

    @property
    def key(self) -> str:
        """A short, stable hash of the payload, evaluation and part (if split): the group's name in file names and
        anchors."""
        part = {"orders": list(self.orders)} if self.orders else {}
        return _short_hash({**self.payload, "evaluation": self.evaluation, **part})

    @property
    def sample_key(self) -> str:
        """The seed of the evaluation-sample bootstrap: the payload and evaluation, not the part, so that a record
        shown in two parts of a group is resampled alike in both (and a part's numbers do not move when another
        part appears)."""
        return _short_hash({**self.payload, "evaluation": self.evaluation})

    @property
    def results_version(self) -> int | None:
        """The numerics version its records were computed by (None: unrecorded, schema-1 records)."""
        return self.payload.get("results_version")


def _short_hash(value: dict) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:10]


@dataclass(frozen=True)
class LeftOut:
    """A record left out of the leaderboard, and why."""

    run_id: str
    reason: str
    kind: str = "superseded"
    """``superseded`` (a newer record or group replaces it) or ``incomplete`` (its seed does not yet cover every
    domain order of the part it belongs to)."""


def group_payload(record: dict) -> dict[str, Any]:
    """What a record shares with the other records of its group (see the module docstring)."""
    from benchmark.records.identity import canonical_config, record_identity

    identity = record_identity(record)
    if identity is not None:
        payload = identity.group_payload()
    else:
        payload = {
            "config": canonical_config(record["config"]),
            "domains": list(record["sequence"]),
            "inputs": dict(sorted(record["data_checksums"].items())),
            "results_version": (record.get("identity") or {}).get("results_version"),
        }
    # The domains as a set: runs over several orders of the same domains form one group, paired by (order, seed).
    return {**payload, "domains": sorted(payload["domains"])}


def order_of(record: dict) -> str:
    """The record's domain order as its run id names it (``seq0``, or ``custom-a-b-c``)."""
    run_id, head = record["run_id"], f"{record['method']}-"
    tail = f"-seed{record['seed']}-"
    if run_id.startswith(head) and tail in run_id:
        return run_id[len(head) : run_id.rindex(tail)]
    return "custom-" + "-".join(record["sequence"])


def pairing_unit(record: dict) -> str:
    """What records of different methods are paired by: the seed, and the order where a group has several."""
    return f"{order_of(record)}/{record['seed']}"


def group_records(records: list[dict]) -> tuple[list[Group], list[LeftOut]]:
    """The leaderboard groups of ``records`` (largest first) and the records left out (superseded or incomplete)."""
    buckets: dict[str, Group] = {}
    for record in records:
        payload = group_payload(record)
        buckets.setdefault(json.dumps(payload, sort_keys=True), Group(payload)).records.append(record)
    left_out: list[LeftOut] = []
    groups = []
    for group in _current_numerics(list(buckets.values()), left_out):
        for part in _split_by_evaluation(group):
            part.records = _newest_per_label_and_seed(part.records, left_out)
            groups += _split_by_orders(part, left_out)
    _title(groups)
    groups.sort(key=lambda g: (-len(g.records), g.title))
    return groups, sorted(left_out, key=lambda s: (s.kind, s.run_id))


def _current_numerics(groups: list[Group], superseded: list[LeftOut]) -> list[Group]:
    """Groups without those whose settings a group of newer numerics has too (their records are superseded)."""

    def settings(group: Group) -> str:
        return json.dumps({k: v for k, v in group.payload.items() if k != "results_version"}, sort_keys=True)

    newest: dict[str, int] = {}
    for group in groups:
        newest[settings(group)] = max(newest.get(settings(group), -1), group.results_version or 0)
    kept = []
    for group in groups:
        latest = newest[settings(group)]
        if (group.results_version or 0) < latest:
            reason = f"older numerics (version {group.results_version or 'unrecorded'}; re-run at version {latest})"
            superseded += [LeftOut(r["run_id"], reason) for r in group.records]
        else:
            kept.append(group)
    return kept


def _newest_per_label_and_seed(records: list[dict], superseded: list[LeftOut]) -> list[dict]:
    """One record per method label and seed: the one of the newest method code, then replay counting (records with a
    recorded identity before migrated ones); the others are superseded."""
    best: dict[tuple[str, int], dict] = {}
    for record in records:
        key = (record["method_label"], pairing_unit(record))
        if key not in best or _code_rank(record) > _code_rank(best[key]):
            if key in best:
                superseded.append(LeftOut(best[key]["run_id"], f"re-run by {record['run_id']}"))
            best[key] = record
        else:
            superseded.append(LeftOut(record["run_id"], f"re-run by {best[key]['run_id']}"))
    return [r for r in records if best[(r["method_label"], pairing_unit(r))] is r]


def _code_rank(record: dict) -> tuple[int, int, int, str]:
    identity = record.get("identity") or {}
    method, replay = identity.get("method_version", 0), identity.get("replay_version", 1)
    return (method, replay, 1 if "method_options" in identity else 0, record["run_id"])


def _split_by_evaluation(group: Group) -> list[Group]:
    """The group, or one group per distinct base-model evaluation of its records (another device or precision)."""
    clusters: list[list[dict]] = []
    for record in group.records:
        home = next((c for c in clusters if _same_base(c[0], record)), None)
        if home is None:
            clusters.append([record])
        else:
            home.append(record)
    return [Group(group.payload, members, evaluation=i) for i, members in enumerate(clusters)]


def _split_by_orders(group: Group, left_out: list[LeftOut]) -> list[Group]:
    """The group, or where its method labels cover different sets of domain orders one part per such set (see the
    module docstring): the part of orders ``S`` holds the labels that cover all of ``S``, and, where ``S`` has several
    orders, only the seeds each of those labels has in every order of ``S`` (also where every label covers the same
    orders: the group is then one part). Records no part holds join ``left_out`` as incomplete."""
    covered: dict[str, set[str]] = {}
    for record in group.records:
        covered.setdefault(record["method_label"], set()).add(order_of(record))
    order_sets = sorted({frozenset(orders) for orders in covered.values()}, key=lambda s: (len(s), sorted(s)))
    if len(order_sets) == 1 and len(order_sets[0]) == 1:
        return [group]  # one order: nothing to split, every seed is complete
    parts, complete_seeds = [], {}
    for orders in order_sets:
        labels = {label for label, have in covered.items() if orders <= have}
        members = [r for r in group.records if r["method_label"] in labels and order_of(r) in orders]
        if len(orders) > 1:
            seeds = set.intersection(
                *(
                    {r["seed"] for r in members if (r["method_label"], order_of(r)) == cell}
                    for cell in {(label, o) for label in labels for o in orders}
                )
            )
            members = [r for r in members if r["seed"] in seeds]
            complete_seeds[orders] = seeds
        if members:
            partial = tuple(sorted(orders)) if labels != set(covered) else ()
            parts.append(Group(group.payload, members, group.evaluation, partial))
    shown = {id(r) for part in parts for r in part.records}
    for record in group.records:
        if id(record) not in shown:
            left_out.append(_incomplete(record, covered[record["method_label"]], complete_seeds))
    return parts


def _incomplete(record: dict, orders: set[str], complete_seeds: dict[frozenset, set[int]]) -> LeftOut:
    """Why ``record`` is in no part: its seed does not cover every order of the widest part its label belongs to."""
    seeds = complete_seeds[frozenset(orders)]
    shown = ", ".join(str(s) for s in sorted(seeds)) or "none yet"
    reason = (
        f"{record['method_label']}, seed {record['seed']}, order {order_of(record)}: its part (orders "
        f"{', '.join(sorted(orders))}) shows only the seeds every one of its methods has run in every order ({shown})"
    )
    return LeftOut(record["run_id"], reason, "incomplete")


def _same_base(a: dict, b: dict) -> bool:
    base_a, base_b = a["lm_loss"]["base"], b["lm_loss"]["base"]
    return base_a.keys() == base_b.keys() and all(abs(base_a[k] - base_b[k]) <= BASE_LOSS_TOLERANCE for k in base_a)


# ----------------------------------------------------------------------------------------------
# Titles
# ----------------------------------------------------------------------------------------------
def _title(groups: list[Group]) -> None:
    """A readable title per group; groups whose titles would be equal are told apart by what differs."""
    plain = {id(g): _plain_title(g) for g in groups}
    for group in groups:
        twins = [g for g in groups if g is not group and plain[id(g)] == plain[id(group)]]
        extra = _differences(group, twins) if twins else []
        group.title = plain[id(group)] + (f" ({'; '.join(extra)})" if extra else "")


def _plain_title(group: Group) -> str:
    first = group.records[0]
    model = str(first["config"]["model"]).split(":")[-1].rstrip("/").split("/")[-1] or first["config"]["model"]
    profiles = ", ".join(sorted({r["profile"] for r in group.records}))
    dap, ft = first["config"]["dap"], first["config"]["finetune"]
    end_tasks = protocol_short(ft)
    orders = sorted({order_of(r) for r in group.records})
    several = f"{len(orders)} domain orders ({', '.join(orders)})"
    domains = " → ".join(first["sequence"]) if len(orders) == 1 else several
    return (
        f"profile {profiles}, model {model}, {domains}, DAP {dap['steps']} x "
        f"{dap['batch_size']} x {dap['seq_len']}, end tasks {end_tasks}, matrix {first['config']['matrix']}"
    )


def _differences(group: Group, twins: list[Group]) -> list[str]:
    """What sets ``group`` apart from groups with the same plain title: settings, inputs, numerics, evaluation."""
    mine = _flat(group.payload["config"])
    keys = set(mine)
    for twin in twins:
        keys |= set(_flat(twin.payload["config"]))
    out = [
        f"{key}={mine.get(key, 'default')}"
        for key in sorted(keys)
        if any(_flat(t.payload["config"]).get(key) != mine.get(key) for t in twins)
    ]
    if any(t.payload["inputs"] != group.payload["inputs"] for t in twins):
        digest = hashlib.sha256(json.dumps(group.payload["inputs"], sort_keys=True).encode()).hexdigest()[:8]
        out.append(f"inputs {digest}")
    if any(t.results_version != group.results_version for t in twins):
        out.append(f"numerics v{group.results_version or '?'}")
    if any(t.payload == group.payload for t in twins):
        devices = sorted({r["environment"].get("device_name", "?") for r in group.records})
        out.append(f"evaluation {group.evaluation + 1} on {', '.join(devices)}")
    return out


def _flat(config: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in config.items():
        if isinstance(value, dict) and key in ("dap", "finetune"):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = json.dumps(value) if isinstance(value, dict | list) else value
    return out
