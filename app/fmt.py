"""Formatting for people: statuses, durations, ETAs, sizes, best metrics."""

from __future__ import annotations

import math
from datetime import UTC, datetime

from db.types import RunRecord

# Material icons (bundled with Streamlit): emoji fonts are missing on many servers and kiosks.
STATUS_ICON = {
    "queued": "schedule", "running": "play_circle", "completed": "check_circle", "early_stopped": "stop_circle",
    "cancelled": "cancel", "failed": "error", "diverged": "warning", "lost": "help",
}
STATUS_COLOR = {
    "queued": "gray", "running": "blue", "completed": "green", "early_stopped": "green", "cancelled": "gray",
    "failed": "red", "diverged": "red", "lost": "orange",
}


def status_label(status: str) -> str:
    """For tables (plain text: a table cell cannot show icons)."""
    return status.replace("_", " ")


def status_md(status: str) -> str:
    """For markdown: coloured, with an icon."""
    color = STATUS_COLOR.get(status, "gray")
    return f":{color}[:material/{STATUS_ICON.get(status, 'circle')}: {status_label(status)}]"


def now() -> datetime:
    return datetime.now(UTC)


def seconds(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return "–"
    s = max(0.0, s)
    if s < 60:
        return f"{s:.0f}s" if s >= 10 else f"{s:.1f}s"
    m, sec = divmod(int(s), 60)
    if m < 60:
        return f"{m}m {sec:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h {m:02d}m"


def duration_s(r: RunRecord) -> float | None:
    if r.started_at is None:
        return None
    end = r.finished_at or now()
    return (end - r.started_at).total_seconds()


def eta_s(r: RunRecord) -> float | None:
    """Remaining time at the rate so far; None until there is a rate to extrapolate."""
    p, d = r.progress or 0.0, duration_s(r)
    if r.status != "running" or d is None or p < 0.01:
        return None
    return d * (1 - p) / p


def age_s(t: datetime | None) -> float | None:
    return None if t is None else (now() - t).total_seconds()


def size(n: int | None) -> str:
    if n is None:
        return "–"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def best(r: RunRecord) -> tuple[str, float | None]:
    """("val/acc", 0.97): the run's best monitored metric from its summary, else its best val/acc so far."""
    b = (r.summary or {}).get("best") or {}
    if b.get("metric") and b.get("value") is not None:
        return b["metric"], float(b["value"])
    acc = r.metrics.get("val/acc")
    if acc is not None and acc.max_value is not None:
        return "val/acc", acc.max_value
    return "", None


def best_text(r: RunRecord) -> str:
    metric, value = best(r)
    return f"{metric} {value:.4f}" if value is not None else ""


def run_label(r: RunRecord) -> str:
    return f"{r.name} ({r.id})" if r.name != r.id else r.id
