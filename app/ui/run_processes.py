"""The Run page's line on a run of several processes (resources.gpus > 1): its batch per rank and in total and its
learning rate, because train.batch_size is the global batch and a reader comparing it with a one-GPU run needs to
know what each process saw. The figures come from the run's own "distributed" event when it has recorded one
(what training actually used), else from its spec (what it asked for)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import streamlit as st

from app.present import text as f
from app.ui import queries
from core.names import CPU_QUEUE, queue_of, run_gpus
from db.types import EventRecord, RunRecord

DISTRIBUTED_KIND = "distributed"  # the event training records once its ranks are up
FIRST_EVENTS = 100  # it is among a run's first events: only these are read
# The event's figures (core/train.py records world_size, per_rank_batch, global_batch and lr).
_WORLD = ("world_size",)
_PER_RANK = ("per_rank_batch",)
_GLOBAL = ("global_batch",)
_LR = ("lr",)


def _first(data: Mapping[str, Any], names: Sequence[str]) -> Any:
    return next(
        (data[k] for k in names if isinstance(data.get(k), (int, float)) and not isinstance(data[k], bool)), None
    )


def distributed_event(events: Sequence[EventRecord]) -> EventRecord | None:
    """The latest event of kind (or code) "distributed": a resumed run records one per attempt."""
    found = [e for e in events if DISTRIBUTED_KIND in (e.kind, e.code, (e.data or {}).get("code"))]
    return found[-1] if found else None


def processes_line(spec: Mapping[str, Any], event: EventRecord | None = None) -> str | None:
    """ "4 processes on 4 GPUs: batch 32 per rank × 4 = 128 in total · learning rate 0.1"; None for a run of one
    process (nothing to say: its batch is the batch)."""
    data = dict((event.data or {}) if event is not None else {})
    world = int(_first(data, _WORLD) or run_gpus(spec))
    if world <= 1:
        return None
    total = _first(data, _GLOBAL) or (spec.get("train") or {}).get("batch_size")
    per_rank = _first(data, _PER_RANK) or (total // world if isinstance(total, int) else None)
    asked = (spec.get("optim") or {}).get("lr")
    lr = _first(data, _LR) or asked
    where = "CPU (gloo)" if queue_of(spec) == CPU_QUEUE else f"{world} GPUs"
    text = f"{world} processes on {where}: batch {per_rank if per_rank is not None else '?'} per rank × {world} = "
    text += f"{total if total is not None else '?'} in total"
    if isinstance(lr, (int, float)):
        text += f" · learning rate {lr:g}"
        if isinstance(asked, (int, float)) and lr != asked:
            text += f" (optim.lr {asked:g})"
    return text + ("" if event is not None else " (from the spec; training has not reported its ranks yet)")


def show(r: RunRecord) -> None:
    """The line under the Run page's header, for a run of several processes only (a script's run has no spec: its
    status panel says it runs on no worker or GPU of torchdeck's)."""
    if r.external or run_gpus(r.spec) <= 1:
        return
    try:
        event = distributed_event(queries.events(r.id, limit=FIRST_EVENTS))
    except Exception:  # noqa: BLE001 - the line is a courtesy; the spec alone still says it
        event = None
    text = processes_line(r.spec, event)
    if text:
        st.caption(f"Processes: {f.md_text(text)}")
