"""The Overview page's data and panels: every running and recently finished run of everyone, with a small
curve of loss and objective per run, diagnosis findings at a glance, and the queue with each run's position
and who can take it.

One refresh costs a fixed number of queries however many runs there are (three pages of runs, their
findings, their curves, the owners' names, the workers): `load` assembles it all, `snapshot` shares it
between viewers for a second."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta

import pandas as pd
import streamlit as st
from sqlalchemy import Engine

from app.present import external as ext
from app.present import text as f
from app.services import queue_place
from app.services.broker import QueueStatus, engine_for, queue_status
from app.services.owners import owner_labels
from app.ui import queries
from core import catalog
from core.names import CLAIMABLE_STATUSES, FINISHED_STATUSES, TRAIN_LOSS, queue_of
from db import overview, repo
from db.queue_order import configured_half_life_s
from db.types import RunRecord

# The live part refreshes this often (seconds): at least every two, a page many people keep open.
REFRESH_S = max(queries.REFRESH_S, 2.0)
WINDOWS = {"1 hour": 3600, "6 hours": 6 * 3600, "24 hours": 24 * 3600, "7 days": 7 * 24 * 3600}
DEFAULT_WINDOW = "24 hours"
MAX_RUNNING, MAX_FINISHED, MAX_QUEUED, SHOWN_QUEUED = 500, 100, 1000, 200
MAX_ATTENTION = 10
OTHER_RUN = "a run of another project"  # a queued run of a project the viewer may not see: it holds a place
DEFAULT_OBJECTIVE = "val/loss"  # core.config's default early_stopping.monitor


@dataclass(frozen=True)
class Attention:
    """A run with diagnosis findings, for the list at the top."""

    run_id: str
    name: str
    status: str
    level: str
    code: str
    message: str
    count: int


@dataclass(frozen=True)
class Snapshot:
    running: pd.DataFrame
    finished: pd.DataFrame
    queued: pd.DataFrame
    attention: tuple[Attention, ...]
    unserved: tuple[str, ...]  # QueueStatus.message() of each queue with waiting runs and no live worker
    running_total: int
    queued_total: int  # waiting runs of every project
    project_queued: int  # waiting runs of the project shown
    finished_more: bool  # more runs finished within the window than shown


def objective(r: RunRecord) -> str:
    """The metric a run is judged on: its early stopping's monitor; a script's run (no spec): val/loss when it
    logs it, else the first key it logs."""
    if r.external:
        logged = sorted(k for k in r.metrics if k != TRAIN_LOSS)
        return DEFAULT_OBJECTIVE if DEFAULT_OBJECTIVE in r.metrics or not logged else logged[0]
    es = ((r.spec or {}).get("train") or {}).get("early_stopping") or {}
    return es.get("monitor") or DEFAULT_OBJECTIVE


def objective_values(r: RunRecord, key: str) -> tuple[float | None, float | None]:
    """(last, best so far) of the objective's per-epoch values (train/loss: train/epoch_loss, the catalog's stored
    key), the best the lowest or the highest as the catalog says."""
    s = r.metrics.get(catalog.stored_key(key))
    if s is None:
        return None, None
    return s.last_value, s.min_value if catalog.better(key) == "min" else s.max_value


def finding_text(found: overview.Findings | None) -> str:
    if found is None:
        return ""
    e = found.latest
    mark = "⛔" if e.level == "error" else "⚠"
    more = f" (+{found.count - 1})" if found.count > 1 else ""
    return f"{mark} {e.code or (e.data or {}).get('code') or e.message}{more}"


def _run_row(r: RunRecord, owners: dict[str, str], found: dict, curves: dict) -> dict:
    key = objective(r)
    last, best = objective_values(r, key)
    return {
        "run": r.name,
        "owner": owners.get(r.owner, r.owner),
        "status": f.status_label(r.status),
        "objective": key,
        "value": last,
        "best": best,
        "diagnosis": finding_text(found.get(r.id)),
        "loss": curves.get((r.id, TRAIN_LOSS), []),
        "objective curve": curves.get((r.id, catalog.stored_key(key)), []),
        "open": f"run?id={r.id}",
    }


def running_frame(runs: list[RunRecord], owners: dict[str, str], found: dict, curves: dict) -> pd.DataFrame:
    rows = [
        {
            **_run_row(r, owners, found, curves),
            "progress": None if r.external else r.progress or 0.0,  # a script says nothing of its progress
            "ETA": f.seconds(f.eta_s(r)),
            # A script's run: logged from wherever its script runs, on no worker of torchdeck's.
            "worker": ext.SOURCE_LABEL if r.external else r.worker_id or "–",
            "device": ext.SOURCE_LABEL if r.external else r.device or "–",
        }
        for r in runs
    ]
    return pd.DataFrame(rows, columns=RUNNING_COLUMNS)


def finished_frame(runs: list[RunRecord], owners: dict[str, str], found: dict, curves: dict) -> pd.DataFrame:
    rows = [
        {
            **_run_row(r, owners, found, curves),
            "finished": f"{f.seconds(f.age_s(r.finished_at))} ago",
            "took": f.seconds(f.duration_s(r)),
        }
        for r in runs
    ]
    return pd.DataFrame(rows, columns=FINISHED_COLUMNS)


_RUN_TAIL = ["objective", "value", "best", "diagnosis", "loss", "objective curve", "open"]
RUNNING_COLUMNS = ["run", "owner", "progress", "ETA", "worker", "device", *_RUN_TAIL]
FINISHED_COLUMNS = ["run", "owner", "status", "finished", "took", *_RUN_TAIL]
QUEUED_COLUMNS = ["position", "queue", "run", "project", "owner", "status", "why", "starts in", "waiting"]
QUEUED_COLUMNS += ["who can take it", "open"]


def takers(status: QueueStatus) -> str:
    """Who would take a run of this queue now, in a table cell."""
    if not status.served:  # a multi-GPU run: how many GPUs it needs and the most any live worker offers
        return status.gap()
    names = ", ".join(w.id + (" (busy)" if w.current_run_id else "") for w in status.workers[:3])
    return names + (f" and {len(status.workers) - 3} more" if len(status.workers) > 3 else "")


def why(q: repo.QueuedRun | None, owner: str) -> str:
    """Why a waiting run is where it is in its queue (db/queue_order.py: priority, then the owner's recent GPU
    time, then age); a lost run has no place: its own message resumes it."""
    if q is None:
        return "resumes from its checkpoint when its message is delivered"
    return queue_place.why(q, owner)


def queued_frame(
    runs: list[RunRecord],
    owners: dict[str, str],
    statuses: dict[str, QueueStatus],
    order: dict[str, repo.QueuedRun],
    typical: dict[str, float] | None = None,
    visible: Collection[str] | None = None,
) -> pd.DataFrame:
    """Each waiting run's position in its own queue, the order a worker takes them (`order`: queue_order's), why,
    and about when it starts (`typical`: each queue's recent run time); lost runs (resumed by their own message)
    first. Every project's runs hold places; those of a project not in `visible` (None: all are) are listed
    without their name, owner, project or link, as OTHER_RUN."""
    rows = []
    for r in runs:
        queue = queue_of(r.spec)
        q = order.get(r.id)
        shown = visible is None or r.project in visible
        owner = owners.get(r.owner, r.owner) if shown else "its owner"
        rows.append(
            {
                "position": q.position if q else None,
                "queue": queue,
                "run": r.name if shown else OTHER_RUN,
                "project": r.project if shown else "",
                "owner": owner if shown else "",
                "status": f.status_label(r.status),
                "why": why(q, owner),
                "starts in": _starts_in(q, len(statuses[queue].workers), (typical or {}).get(queue)),
                "waiting": f.seconds(f.age_s(r.created_at)),
                "who can take it": takers(statuses[queue]),
                "open": f"run?id={r.id}" if shown else None,
            }
        )
    rows.sort(key=lambda row: (row["queue"], row["position"] or 0))
    frame = pd.DataFrame(rows, columns=QUEUED_COLUMNS)
    return frame.astype({"position": "Int64"})  # (a lost run's empty position keeps the others whole numbers)


def _starts_in(q: repo.QueuedRun | None, workers: int, typical_s: float | None) -> str:
    if q is None:
        return "when a worker takes its message"
    eta = queue_place.start_eta_s(q.position, workers, typical_s)
    if eta is None:
        return "no worker takes it" if workers < 1 else "no completed run to go by"
    return f"about {f.seconds(eta)}"


def queue_table(
    engine: Engine, wait: repo.Waiting, owners: dict[str, str], visible: Collection[str] | None = None
) -> tuple[pd.DataFrame, dict[str, QueueStatus]]:
    """queued_frame of the waiting runs (repo.waiting: the Overview and Workers pages), those of projects not in
    `visible` unnamed, and the status of each of their queues."""
    statuses = {q: queue_status(q, engine=engine) for q in sorted({queue_of(r.spec) for r in wait.runs})}
    typical = repo.typical_run_s(engine, statuses)
    return queued_frame(wait.runs, owners, statuses, wait.places, typical, visible), statuses


def waiting(engine: Engine, limit: int = SHOWN_QUEUED) -> repo.Waiting:
    """The waiting runs the Overview (and, more of them, the Workers page) lists: lost ones, then the queues' first
    places."""
    return repo.waiting(engine, limit=limit, half_life_s=configured_half_life_s())


def attention(runs: list[RunRecord], found: dict[str, overview.Findings]) -> tuple[Attention, ...]:
    """The runs shown that have findings: errors first, then running before finished, newest finding first."""
    out = []
    for r in runs:
        if (hit := found.get(r.id)) is not None:
            e = hit.latest
            out.append(
                Attention(
                    r.id, r.name, r.status, e.level, e.code or (e.data or {}).get("code") or "", e.message, hit.count
                )
            )
    order = {a.run_id: found[a.run_id].latest.id for a in out}
    return tuple(sorted(out, key=lambda a: (a.level != "error", a.status != "running", -order[a.run_id])))


def load(
    engine: Engine,
    window_s: float,
    now: datetime | None = None,
    *,
    project: str | None = None,
    visible: Collection[str] | None = None,
) -> Snapshot:
    """Everything one refresh shows, from the database (no cache): the running and recently finished runs of
    `project` (None: of all), and the whole queue, its runs of projects not in `visible` unnamed (None: none)."""
    now = now or f.now()
    running = repo.list_runs(engine, status="running", sort="started_at", limit=MAX_RUNNING, project=project)
    done = repo.list_runs(
        engine, status=list(FINISHED_STATUSES), sort="finished_at", limit=MAX_FINISHED, project=project
    )
    since = now - timedelta(seconds=window_s)
    recent = [r for r in done.runs if r.finished_at is not None and r.finished_at >= since]
    queued = waiting(engine)
    shown = [*running.runs, *recent]
    found = overview.findings(engine, [r.id for r in shown])
    curves = overview.curves(
        engine, [(r.id, key) for r in shown for key in (TRAIN_LOSS, catalog.stored_key(objective(r)))]
    )
    named = [r for r in queued.runs if visible is None or r.project in visible]
    owners = owner_labels({r.owner for r in [*shown, *named]}, engine=engine)
    queued_table, statuses = queue_table(engine, queued, owners, visible)
    waiting_here = repo.list_runs(
        engine, status=list(CLAIMABLE_STATUSES), project=project, source="torchdeck", limit=1
    ).total
    return Snapshot(
        running=running_frame(list(running.runs), owners, found, curves),
        finished=finished_frame(recent, owners, found, curves),
        queued=queued_table,
        attention=attention(shown, found),
        unserved=tuple(s.message() for s in statuses.values() if not s.served),
        running_total=running.total,
        queued_total=queued.total,
        project_queued=waiting_here,
        finished_more=len(recent) == len(done.runs) and done.total > len(done.runs),
    )


@st.cache_data(ttl=1, show_spinner=False, max_entries=64)
def _snapshot(url: str, window_s: float, project: str, visible: frozenset[str] | None) -> Snapshot:
    return load(engine_for(url), window_s, project=project, visible=visible)


def snapshot(window_s: float, project: str, visible: frozenset[str] | None) -> Snapshot:
    """`load` of `project`, the queue's runs of projects not in `visible` unnamed: shared for a second between
    everyone who has the page open on that project and sees the same projects."""
    return _snapshot(queries.db_url(), window_s, project, visible)


# --- panels -----------------------------------------------------------------------------------------------------


def _columns() -> dict:
    cc = st.column_config
    return {
        "progress": cc.ProgressColumn("progress", min_value=0.0, max_value=1.0, format="percent"),
        "value": cc.NumberColumn("value", format="%.4f", help="The objective's last value."),
        "best": cc.NumberColumn("best", format="%.4f", help="The objective's best value so far."),
        "diagnosis": cc.TextColumn("diagnosis", help="The latest diagnosis warning or error (and how many more)."),
        "loss": cc.LineChartColumn("train/loss", help="The whole run's training loss."),
        "objective curve": cc.LineChartColumn("objective curve", help="The whole run's objective."),
        "open": cc.LinkColumn("open", display_text="open ↗"),
    }


def counts(s: Snapshot, window: str) -> None:
    a, b, c, d = st.columns(4)
    a.metric("Running", s.running_total)
    b.metric("Queued", s.project_queued)
    c.metric(f"Finished in {window}", f"{len(s.finished)}{'+' if s.finished_more else ''}")
    d.metric("Needing attention", len(s.attention))


def attention_panel(s: Snapshot) -> None:
    """Diagnosis findings at a glance: errors first; what a run wrote is shown as text."""
    for a in s.attention[:MAX_ATTENTION]:
        show = st.error if a.level == "error" else st.warning
        more = f" ({a.count} findings)" if a.count > 1 else ""
        code = f"**{f.md_text(a.code)}**: " if a.code and a.code != a.message else ""
        show(
            f"**{f.md_text(a.name)}** ({f.status_label(a.status)}){more} — {code}{f.md_text(a.message)}",
            icon=":material/troubleshoot:",
        )
    if len(s.attention) > MAX_ATTENTION:
        st.caption(f"and {len(s.attention) - MAX_ATTENTION} more runs with findings: see the diagnosis column.")


def table(rows: pd.DataFrame, empty: str, more: str | None = None) -> None:
    """A panel's table: `empty` said instead when it has no rows, `more` under it when it shows only some. A value
    not there yet (an objective before the first validation) is drawn as a dash."""
    if rows.empty:
        st.caption(empty)
        return
    st.dataframe(rows, hide_index=True, width="stretch", column_config=_columns(), placeholder=f.EMPTY)
    if more:
        st.caption(more)


def running_panel(s: Snapshot) -> None:
    st.subheader("Running")
    table(
        s.running,
        "Nothing is running.",
        f"The {len(s.running)} started last of {s.running_total} running runs: the Runs page lists all."
        if s.running_total > len(s.running)
        else None,
    )


def finished_panel(s: Snapshot, window: str) -> None:
    st.subheader("Recently finished")
    table(
        s.finished,
        f"No run finished in the last {window}.",
        f"The {len(s.finished)} that finished last: the Runs page lists all." if s.finished_more else None,
    )


def queue_panel(s: Snapshot) -> None:
    st.subheader("Queued")
    for message in s.unserved:
        st.warning(message[0].upper() + message[1:], icon=":material/hourglass_disabled:")
    table(
        s.queued,
        "The queue is empty.",
        f"The first {len(s.queued)} of {s.queued_total} waiting runs: the Workers page lists more."
        if s.queued_total > len(s.queued)
        else None,
    )
