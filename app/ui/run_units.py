"""The Runs page grouped: one row per sweep, one per seed group (runs that differ only by seed) and one per
other run. The rows are paged in the database (a GROUP BY over the matching runs), so a page costs a few
queries whatever the number of runs; each row's figures come from its sweep's or group's runs."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from app.present import test_scores
from app.present import text as f
from app.present.seed_groups import mean_std_text
from core.names import SUCCESS_STATUSES
from db.types import RunRecord, SweepRecord
from db.units import GROUP, RUN, SWEEP, Members, Unit, UnitPage, list_units, load, members  # noqa: F401 - the page reads them here


# --- the rows' text ------------------------------------------------------------------------------------
def statuses_text(runs: Sequence[RunRecord]) -> str:
    """`completed` when all are; else `2 running · 1 pruned`, most common first."""
    counts = Counter(r.status for r in runs)
    if len(counts) == 1:
        return f.status_label(next(iter(counts)))
    return " · ".join(f"{n} {f.status_label(s)}" for s, n in counts.most_common())


def objective_text(runs: Sequence[RunRecord]) -> str:
    """The runs' best monitored metric as `val/acc 0.9712 ± 0.0031 (n=3)` (the metric most of them monitor)."""
    best = [f.best(r) for r in runs]
    metrics = Counter(m for m, v in best if v is not None)
    if not metrics:
        return ""
    metric = metrics.most_common(1)[0][0]
    return f"{metric} {mean_std_text([v for m, v in best if m == metric])}"


def _finished_share(runs: Sequence[RunRecord]) -> float:
    return sum(1.0 if r.finished else (r.progress or 0.0) for r in runs) / max(len(runs), 1)


def group_row(group_id: str, runs: Sequence[RunRecord], matching: int, owner: str) -> dict[str, Any]:
    first = runs[0]
    return {
        "kind": GROUP,
        "name": first.name,
        "status": statuses_text(runs),
        "progress": _finished_share(runs),
        "size": _size(len(runs), matching, "run"),
        "best": objective_text(runs),
        "owner": owner,
        "created": first.created_at,
        "open": compare_link(runs),
        "id": group_id,
    }


def _size(n: int, matching: int, noun: str) -> str:
    text = f"{n} {noun}{'s' if n != 1 else ''}"
    return text + (f" ({matching} match)" if matching < n else "")


def compare_link(runs: Sequence[RunRecord], limit: int = 20) -> str:
    """Compare of a seed group's runs, grouped, in their project (Compare shows at most `limit` runs)."""
    return f"compare?ids={','.join(r.id for r in runs[:limit])}&group=seed&project={runs[0].project}"


def sweep_objective(sweep: SweepRecord) -> tuple[str, str] | None:
    """The sweep's objective: (stored metric key, "min" or "max"); None for a spec this code cannot read."""
    from sweep.spec import SweepSpec

    try:
        spec = SweepSpec.model_validate(dict(sweep.spec))
    except Exception:  # noqa: BLE001 - an older or foreign spec: the row shows no best
        return None
    return spec.stored_metric, spec.mode


def sweep_best(sweep: SweepRecord, runs: Sequence[RunRecord]) -> str:
    """The completed trial with the best objective (the mean over its seeds): `val/acc 0.97 ± 0.01 (n=3) · trial 4`."""
    objective = sweep_objective(sweep)
    if objective is None:
        return ""
    key, mode = objective
    by_trial: dict[int, list[float]] = {}
    for r in runs:
        s = r.metrics.get(key)
        value = None if s is None else (s.max_value if mode == "max" else s.min_value)
        if r.status in SUCCESS_STATUSES and value is not None and r.trial is not None:
            by_trial.setdefault(r.trial, []).append(value)
    if not by_trial:
        return ""
    mean = {t: sum(v) / len(v) for t, v in by_trial.items()}
    top = (max if mode == "max" else min)(mean, key=lambda t: mean[t])
    tested = [v for v in test_scores.mean_of([r for r in runs if r.trial == top]) if v is not None]
    return (
        f"{key} {mean_std_text(by_trial[top])}"
        + (f" · test/acc {mean_std_text(tested)}" if tested else "")
        + (f" · trial {top}")
    )


def sweep_row(sweep: SweepRecord, runs: Sequence[RunRecord], matching: int, owner: str) -> dict[str, Any]:
    trials = {r.trial for r in runs if r.trial is not None}
    done = {r.trial for r in runs if r.trial is not None and r.finished} - {r.trial for r in runs if not r.finished}
    planned = max(len(trials), int((sweep.spec.get("budget") or {}).get("trials") or 0))
    status = f.status_label(sweep.status) + (f" · {statuses_text(runs)}" if runs else "")
    return {
        "kind": SWEEP,
        "name": sweep.name,
        "status": status,
        "progress": 1.0 if sweep.finished else len(done) / max(planned, 1),
        "size": f"{len(trials)} trial{'s' if len(trials) != 1 else ''} · {_size(len(runs), matching, 'run')}",
        "best": sweep_best(sweep, runs),
        "owner": owner,
        "created": sweep.created_at,
        "open": f"sweep?id={sweep.id}",
        "id": sweep.id,
    }


def run_row(r: RunRecord, owner: str) -> dict[str, Any]:
    return {
        "kind": RUN,
        "name": r.name,
        "status": f.status_label(r.status),
        "progress": r.progress or 0.0,
        "size": "",
        "best": f.best_text(r),
        "owner": owner,
        "created": r.created_at,
        "open": f"run?id={r.id}",
        "id": r.id,
    }


COLUMNS = ["kind", "name", "status", "progress", "size", "best", "owner", "created", "open", "id"]
