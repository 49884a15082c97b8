"""A running run's series, held once per dashboard process and shared by everyone watching the run.

Each live refresh first reads the run's series state: one row per metric key with its point count
(the whole-series rollup rows, one short range of a primary key). Only the keys whose count grew
are read again, and only their new points (`since_step`); the charts built from them are cached by
the counts they were built from. Ten teammates on one run's page cost one state read per refresh
and one read of each new batch of points, not ten of each; a refresh where nothing was written
costs the state read alone (a few keys' counts: cheaper than any cache of it)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Sequence

import streamlit as st
from sqlalchemy import Engine
from streamlit.runtime.scriptrunner import get_script_run_ctx

from db import repo

LIVE_POINTS = 600  # per series (a chart is ~600 px wide), downsampled again when twice that many are held
POLL_S = 0.1  # while a live view waits for new points, the run's counts are read this often (once for all viewers)
WAIT_S = 2.0  # a live view's refresh waits at most this long for new points before it redraws anyway
IDLE_S = 120.0  # a run nobody asked about for this long is dropped from the process


class SharedRun:
    """One running run's series and charts, for every session of this process."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.lock = threading.Lock()
        self.counts: dict[str, int] = {}
        self.steps: dict[str, list[int]] = {}
        self.values: dict[str, list[float]] = {}
        self.used = time.monotonic()
        self._anchors: tuple[tuple, list] = ((), [])
        self._latest: tuple[float, dict[str, int]] = (float("-inf"), {})
        self._built: dict[Hashable, object] = {}

    def refresh(self, engine: Engine) -> dict[str, int]:
        """Each key's point count, with the series of the keys that grew brought up to date (one read)."""
        with self.lock:
            self.used = time.monotonic()
            counts = repo.series_counts(engine, self.run_id)
            grown = {key: count for key, count in counts.items() if self.counts.get(key) != count}
            if grown:
                # First read, or time to downsample again: the whole series; else the points after the last held.
                since = {
                    key: None
                    if not self.steps.get(key) or len(self.steps[key]) > 2 * LIVE_POINTS
                    else self.steps[key][-1]
                    for key in grown
                }
                for key, s in repo.series_many(engine, self.run_id, since, max_points=LIVE_POINTS).items():
                    if since[key] is None:
                        self.steps[key], self.values[key] = list(s.steps), list(s.values)
                    else:
                        self.steps[key].extend(s.steps)
                        self.values[key].extend(s.values)
                self.counts.update(grown)
            return dict(self.counts)

    def latest_counts(self, engine: Engine) -> dict[str, int]:
        """The counts as stored now, read at most once per POLL_S for every viewer waiting on this run."""
        with self.lock:
            at, counts = self._latest
            if time.monotonic() - at >= POLL_S:
                counts = repo.series_counts(engine, self.run_id)
                self._latest = (time.monotonic(), counts)
            return counts

    def wait_for_growth(
        self, engine: Engine, seen: dict[str, int], timeout_s: float, interrupted: Callable[[], bool]
    ) -> None:
        """Return once a series has grown past `seen`, `interrupted()` says so, or after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not interrupted():
            if self.latest_counts(engine) != seen:
                return
            time.sleep(POLL_S / 2)

    def get(self, key: str) -> tuple[Sequence[int], Sequence[float]]:
        return self.steps.get(key, []), self.values.get(key, [])

    def anchors(self, engine: Engine, version: tuple) -> list[tuple[int, int, float]]:
        """The run's epoch anchors (repo.epoch_anchors), read again only when `version` changes."""
        with self.lock:
            if self._anchors[0] != version:
                self._anchors = (version, repo.epoch_anchors(engine, self.run_id))
            return self._anchors[1]

    def built(self, key: Hashable, build: Callable[[], object]) -> object:
        """`build()`'s result, cached under `key` (which names everything the result depends on)."""
        with self.lock:
            if key in self._built:
                return self._built[key]
        value = build()
        with self.lock:
            if len(self._built) > 256:
                self._built.clear()
            self._built[key] = value
        return value


@st.cache_resource(show_spinner=False)
def _registry() -> tuple[threading.Lock, dict[tuple[str, str], SharedRun]]:
    return threading.Lock(), {}


def shared(url: str, run_id: str) -> SharedRun:
    """The process's SharedRun of a run in the database at `url`."""
    lock, runs = _registry()
    with lock:
        now = time.monotonic()
        for k in [k for k, r in runs.items() if now - r.used > IDLE_S]:
            del runs[k]
        run = runs.get((url, run_id))
        if run is None:
            run = runs[(url, run_id)] = SharedRun(run_id)
        run.used = now
        return run


def fragment_rerun() -> bool:
    """Whether this script run reruns fragments only (a live view's timer), not the whole page."""
    ctx = get_script_run_ctx()
    return bool(ctx is not None and ctx.fragment_ids_this_run)


def preempted() -> bool:
    """Whether the session wants something else now: a full rerun (a click, a new URL) or a stop.

    Streamlit has no public call for this; it is read from the runner's pending request, and where that
    is not there (another Streamlit version) the answer is False: a wait then simply lasts its timeout."""
    ctx = get_script_run_ctx()
    requests = getattr(ctx, "script_requests", None)
    state = getattr(getattr(requests, "_state", None), "name", None)
    if state == "STOP":
        return True
    data = getattr(requests, "_rerun_data", None)
    timer_only = data is not None and bool(data.fragment_id_queue) and not data.is_fragment_scoped_rerun
    return state == "RERUN" and not timer_only
