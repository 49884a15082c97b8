"""Panels of the Run page: status and progress, lineage and notes, repeat with seeds, diagnosis, evaluation,
events, samples and spec (the Artifacts tab is run_files.py). Each takes a RunRecord and draws; the page decides
which of them refresh live."""

from __future__ import annotations

from collections import deque
from urllib.parse import quote

import pandas as pd
import streamlit as st

from app.present import figures
from app.present import text as f
from app.services.artifacts import artifact_problem, read_artifact
from app.services.broker import queue_status, run_queue
from app.services.runs import spec_of
from app.ui import error_view, external_view, frame, project_context, queries, queue_view, run_units
from core.config import RunSpec
from core.names import HISTOGRAM_EVENT, SAMPLE_GRID
from db.types import EventRecord, RunRecord


class EventLog:
    """What the Run page shows of a run's events, held in session state and extended with only the events
    after the last id seen: the latest evaluation, the findings (diagnosis, errors; at most FINDINGS) and
    the RECENT last events, and at most HISTOGRAMS weight/gradient histograms (every `stride`-th: it doubles
    when they fill up). Older events stay in the database, never in every viewer's memory."""

    RECENT, FINDINGS, HISTOGRAMS = 500, 200, 400
    PAGE = 2000  # events read per query; a run with more is read page by page, so the newest are shown

    def __init__(self) -> None:
        self.after = 0
        self.recent: deque[EventRecord] = deque(maxlen=self.RECENT)
        self.findings: list[EventRecord] = []
        self.evaluation: EventRecord | None = None
        self.histograms: list[EventRecord] = []
        self.stride, self.seen_histograms = 1, 0

    @classmethod
    def of(cls, run_id: str) -> list[EventRecord]:
        log = st.session_state.setdefault(f"run.events.{run_id}", cls())
        while True:
            page = queries.events(run_id, after_id=log.after, limit=cls.PAGE)
            for e in page:
                log.after = e.id
                if e.kind == "evaluation" and (e.data or {}).get("per_class_acc") is not None:
                    log.evaluation = e
                elif e.kind == HISTOGRAM_EVENT:
                    log.add_histogram(e)
                    continue  # not in the event log's table
                elif _finding(e) and len(log.findings) < cls.FINDINGS:
                    log.findings.append(e)
                log.recent.append(e)
            if len(page) < cls.PAGE:
                break
        kept = [*log.findings, *([log.evaluation] if log.evaluation else []), *log.histograms, *log.recent]
        return sorted({e.id: e for e in kept}.values(), key=lambda e: e.id)

    def add_histogram(self, e: EventRecord) -> None:
        self.seen_histograms += 1
        if (self.seen_histograms - 1) % self.stride:
            return
        self.histograms.append(e)
        if len(self.histograms) > self.HISTOGRAMS:
            self.histograms, self.stride = self.histograms[::2], self.stride * 2


def _finding(e: EventRecord) -> bool:
    return e.kind == "diagnosis" or (e.kind == "lifecycle" and e.level == "error")


def status_panel(r: RunRecord) -> None:
    a, b, c, d = st.columns([1.2, 3, 1.5, 1.5])
    a.markdown(f"#### {f.status_md(r.status)}")
    p = r.progress or (1.0 if r.status == "completed" else 0.0)
    eta = f.eta_s(r)
    if r.external:  # a script says nothing of its progress
        b.markdown(external_view.progress_line(r, f.now()))
    else:
        b.progress(
            min(max(p, 0.0), 1.0),
            text=f"{p:.0%} · elapsed {f.seconds(f.duration_s(r))}"
            + (f" · ETA {f.seconds(eta)}" if eta is not None else ""),
        )
    metric, value = f.best(r)
    best_epoch = ((r.summary or {}).get("best") or {}).get("epoch")
    c.metric(
        f"best {f.md_text(metric)}" if metric else "best",
        f"{value:.4f}" if value is not None else "–",
        help=f"at epoch {best_epoch}" if best_epoch else None,
    )
    d.caption(
        external_view.worker_caption()
        if r.external
        else f"worker {f.code_span(r.worker_id or '–')}  \ndevice {f.code_span(r.device or '–')} · attempt {r.attempt}"
    )
    if r.status == "queued" and not r.external:
        waiting_for(run_queue(spec_of(r)))
        queue_view.place_panel(r)
    if r.degraded:
        st.warning(f"Incomplete record: {f.md_text(r.degraded, multiline=True)}", icon=":material/database_off:")
    if r.status == "lost" and r.external:  # its script fell silent: nothing re-queues it
        external_view.lost_warning(r)
    elif r.status == "lost":
        st.warning(
            "The worker running this run stopped heartbeating; it will be re-queued and resume from its last "
            "checkpoint.",
            icon=":material/heart_broken:",
        )
    if r.cancel_requested and not r.finished:
        st.info("Cancel requested: the run stops after its current step.", icon=":material/stop_circle:")
    if r.error:
        st.error(f.md_text(r.error, multiline=True), icon=":material/error:")  # its text, never Markdown


def relation(parent: RunRecord, child: RunRecord) -> tuple[str, str]:
    """How `child` was made from `parent`, as the child says it and as the parent lists it: a fine-tune (its
    weights are the parent's checkpoint), a seed copy (same seed group), a re-run (the same spec), else a clone."""
    weights = str(((child.spec or {}).get("model") or {}).get("weights_file") or "")
    if parent.id in weights:
        return "fine-tuned from", "fine-tune"
    if child.group_id and child.group_id == parent.group_id:
        return "seed copy of", "seed copy"
    if child.spec_hash == parent.spec_hash:
        return "re-run of", "re-run"
    return "clone of", "clone"


CHILDREN_SHOWN = 10


def lineage(r: RunRecord) -> None:
    """Where the run belongs, as links: its parent run, the sweep it is a trial of, its seed group (on Compare,
    grouped), and the runs made from it (clones, re-runs, seed copies, fine-tunes): those the user may see."""
    bits = []
    parent = queries.run(r.parent_id) if r.parent_id else None
    if parent is not None and project_context.may_read(parent.project):
        bits.append(
            f":material/family_history: {relation(parent, r)[0]} [{f.md_text(parent.name)}](run?id={parent.id})"
        )
    if r.sweep_id and (sweep := queries.sweep(r.sweep_id)) is not None:
        trial = f"trial {r.trial} of sweep" if r.trial is not None else "run of sweep"
        bits.append(f":material/science: [{trial} {f.md_text(sweep.name)}](sweep?id={r.sweep_id})")
    if r.group_id and len(members := queries.group_runs(r.group_id)) > 1:
        bits.append(f":material/stacks: [seed group of {len(members)} runs]({run_units.compare_link(members)})")
    if bits:
        st.caption(" · ".join(bits))
    kids = queries.children(r.id, limit=CHILDREN_SHOWN)
    shown = [c for c in kids.runs if project_context.may_read(c.project)]  # a clone may be of another project
    if shown:
        links = ", ".join(f"[{f.md_text(c.name)}](run?id={c.id}) ({relation(r, c)[1]})" for c in shown)
        total = kids.total if len(shown) == len(kids.runs) else len(shown)
        more = total - len(shown)
        every = f"runs?q={quote(f'parent == {r.id}')}&project={quote(r.project)}"
        st.caption(
            f":material/account_tree: {total} run(s) made from this one: {links}"
            + (f" and [{more} more]({every})" if more > 0 else "")
        )


def notes_panel(r: RunRecord) -> None:
    """The run's notes as their text (never Markdown), scrolled when long."""
    if not r.notes:
        return
    long = len(r.notes) > 800 or r.notes.count("\n") > 8
    with st.container(border=True, height=240 if long else "content"):
        st.caption(":material/notes: Notes")
        st.markdown(f.md_text(r.notes, multiline=True))


def repeat_with_seeds(r: RunRecord, container) -> None:
    """The run's spec again with k − 1 more seeds (seed + 1, ...): with this run, one seed group."""
    seed = (r.spec or {}).get("seed")
    with container.popover(
        "Seeds…",
        icon=":material/stacks:",
        width="stretch",
        help="Repeat with k seeds: this run and k − 1 copies with other seeds, as one group",
    ):
        k = int(
            st.number_input(
                "Runs in the seed group",
                min_value=2,
                max_value=20,
                value=3,
                step=1,
                key=f"run.seeds.{r.id}",
                help=f"This run and k − 1 copies with seeds {seed} + 1, {seed} + 2, …: shown as "
                "one mean ± std on Compare and the sweep page.",
            )
        )
        if r.group_id and len(members := queries.group_runs(r.group_id)) > 1:
            st.caption(f"The new runs join this run's seed group of {len(members)} runs.")
        if not st.button(f"Repeat with {k} seeds", key=f"run.repeat.{r.id}", type="primary", icon=":material/replay:"):
            return
        from app.services import sweeps  # the sweep package (and Optuna) only once someone repeats a run

        try:
            new = sweeps.repeat_with_seeds(r.id, k, owner=project_context.acting().id, engine=queries.engine())
        except (RuntimeError, ValueError) as e:
            st.error(f.md_text(e, multiline=True))
            return
    st.session_state[f"run.repeated.{r.id}"] = [x.id for x in new]
    queries.clear()
    st.rerun()  # the header shows the seed group, the notice its runs


def repeated_notice(r: RunRecord) -> None:
    """After Repeat with k seeds: the new runs and their group on Compare."""
    ids = st.session_state.pop(f"run.repeated.{r.id}", None)
    if not ids:
        return
    new = queries.runs_by_id(ids)
    seeds = ", ".join(str((new[i].spec or {}).get("seed")) for i in ids if i in new)
    st.success(
        f"Queued {len(ids)} run(s) with seeds {seeds}: with this run they form one seed group.",
        icon=":material/stacks:",
    )
    for run_id in ids:
        if run_id in new:
            st.page_link(
                frame.RUN, label=f.md_text(new[run_id].name), query_params={"id": run_id}, icon=":material/monitoring:"
            )
    members = queries.group_runs(r.group_id) if r.group_id else [r, *new.values()]
    st.page_link(
        frame.COMPARE,
        label=f"Compare the seed group ({len(members)} runs)",
        icon=":material/compare_arrows:",
        query_params={"ids": ",".join(m.id for m in members[:20]), "group": "seed"},
    )


def waiting_for(queue: str) -> None:
    """Which live workers would take a run from `queue`, or that none would and how to fix it."""
    status = queue_status(queue, engine=queries.engine())
    text = status.message()
    if status.served:  # it names the workers and their hosts: as text
        st.info(f.md_text(text[0].upper() + text[1:]), icon=":material/hourglass_top:")
    else:
        st.warning(text[0].upper() + text[1:], icon=":material/hourglass_disabled:")


def diagnosis_panel(events: list[EventRecord]) -> None:
    found = [e for e in events if _finding(e)]
    if not found:
        st.success(
            "No problems found so far: loss finite, gradients in range, no data bottleneck.",
            icon=":material/health_and_safety:",
        )
        return
    for e in found:
        data = e.data or {}
        show = st.error if e.level == "error" else st.warning
        advice = data.get("advice")
        code = f.md_text(e.code or data.get("code") or e.kind)  # what a run wrote is shown as text
        show(
            f"**{code}** — {f.md_text(e.message, multiline=True)}"
            + (f"\n\n**What to do:** {f.md_text(advice, multiline=True)}" if advice else ""),
            icon=":material/troubleshoot:",
        )
        if data.get("traceback"):
            with st.expander("traceback"):
                st.code(data["traceback"], language="text")


def evaluation_panel(r: RunRecord, events: list[EventRecord]) -> None:
    """The latest evaluation (confusion matrix, per-class accuracy, precision/recall/F1), the best epoch's most
    confident mistakes, and the weight and gradient histograms over steps."""
    evals = [e for e in events if e.kind == "evaluation" and (e.data or {}).get("per_class_acc") is not None]
    if evals:
        _evaluation(r, evals[-1].data)
        error_view.scores_panel(r, evals[-1].data)
        error_view.gallery_panel(r)
    else:
        st.caption("The confusion matrix and per-class accuracy appear after the first validation epoch.")
    error_view.histogram_panel(r, events)


def _evaluation(r: RunRecord, last: dict) -> None:
    names = last.get("class_names") or [str(i) for i in range(len(last["per_class_acc"]))]
    shown = f" Per-class accuracy of {f.md_text(last['classes_shown'])}." if last.get("classes_shown") else ""
    st.caption(f"After epoch {f.md_text(last.get('epoch', '?'))}.{shown}")
    left, right = st.columns(2)
    if last.get("confusion"):
        left.plotly_chart(
            figures.confusion_figure(last["confusion"], names, uirevision=f"{r.id}:cm"),
            key=f"run.cm.{r.id}",
            config={"displaylogo": False},
        )
    else:  # many classes: the most confused pairs instead of a matrix nobody could read
        pairs = last.get("top_confusions") or []
        left.dataframe(pd.DataFrame(pairs, columns=["true", "predicted", "count"]), hide_index=True)
    right.plotly_chart(
        figures.bar_figure(
            "Per-class accuracy (validation)",
            names,
            last.get("per_class_acc", []),
            y_title="accuracy",
            uirevision=f"{r.id}:pc",
            percent=True,
        ),
        key=f"run.pc.{r.id}",
        config={"displaylogo": False},
    )


def events_panel(events: list[EventRecord]) -> None:
    events = [e for e in events if e.kind != HISTOGRAM_EVENT]  # shown as heat maps on the Evaluation tab
    if not events:
        st.caption("No events yet.")
        return
    df = pd.DataFrame(
        [
            {
                "time": e.time,
                "kind": e.kind,
                "level": e.level,
                "code": e.code or (e.data or {}).get("code"),
                "message": e.message,
            }
            for e in reversed(events)
        ]
    )
    st.dataframe(
        df,
        hide_index=True,
        width="stretch",
        height=min(38 + 35 * len(df), 420),
        column_config={"time": st.column_config.DatetimeColumn("time", format="HH:mm:ss")},
    )


def samples_panel(r: RunRecord) -> None:
    if r.external:
        external_view.not_applicable("samples")
        return
    grids = [a for a in queries.artifacts(r.id) if a.kind == SAMPLE_GRID]
    image = None
    if grids and artifact_problem(grids[-1]) is None:
        try:
            image = read_artifact(grids[-1].id, engine=queries.engine())  # from the artifact store
        except (LookupError, OSError):
            image = None
    if image is None:
        st.caption("The labelled sample grid appears once the run has loaded its data (pre-flight).")
        return
    st.image(image, caption="Training samples with their labels: a mismatch here is the most hidden bug")


def spec_panel(r: RunRecord) -> None:
    if r.external:  # no spec: the params and tags its script logged
        external_view.params_panel(r)
        return
    text = RunSpec.model_validate(dict(r.spec)).to_yaml()
    st.download_button(
        "Download spec (YAML)",
        text,
        file_name=f"{r.name}.yaml",
        mime="application/yaml",
        icon=":material/download:",
        key=f"run.spec_dl.{r.id}",
    )
    st.code(text, language="yaml")
