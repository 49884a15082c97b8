"""Seeding the database for dashboard tests and benchmarks, through db.repo like a worker would,
and finding widgets and their error slots in an AppTest tree."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine

from core.config import RunSpec
from db import repo
from db.types import DEFAULT_PROJECT, EventInput, MetricPoint
from tests._servers import free_port  # noqa: F401 - a port no other xdist worker is handed (test_secrets)

DIGITS = {
    "name": "digits-test",
    "data": {"name": "digits", "image_size": 16},
    "train": {"epochs": 3},
    "export": {"formats": ["onnx"]},
}


def seed_run(
    engine: Engine,
    name: str = "r",
    *,
    status: str = "completed",
    spec: dict | None = None,
    tags: tuple[str, ...] = (),
    owner: str = "local",
    steps: int = 0,
    epochs: int = 0,
    lr: float = 0.001,
    val_acc: float = 0.9,
    fingerprint: str | None = None,
    project: str = DEFAULT_PROJECT,
) -> repo.RunRecord:
    """A run in any state (of `project`), with `steps` per-step points and `epochs` per-epoch points (and, when it
    ended, its dataset's `fingerprint` in its summary, as core/train.py records it)."""
    s = {**DIGITS, **(spec or {}), "optim": {"lr": lr}}
    s = RunSpec.model_validate(s).model_dump(mode="json")
    r = repo.create_run(engine, s, name=name, owner=owner, tags=list(tags), project=project)
    if status == "queued":
        return repo.get_run(engine, r.id)
    repo.claim_run(engine, r.id, "w1", device="cpu")
    pts = [
        MetricPoint("train/loss", i, 2.3 / (1 + 0.01 * i), 1 + i * max(epochs, 1) // max(steps, 1))
        for i in range(1, steps + 1)
    ]
    per = max(steps // max(epochs, 1), 1)
    for e in range(1, epochs + 1):
        acc = val_acc * e / epochs
        pts += [
            MetricPoint("val/loss", e * per, 1.0 / e, e),
            MetricPoint("val/acc", e * per, acc, e),
            MetricPoint("epoch_time_s", e * per, 1.5, e),
        ]
    if pts:
        repo.append_metrics(engine, r.id, pts)
    if status == "running":
        repo.heartbeat(engine, r.id, worker_id="w1", progress=0.5)
        return repo.get_run(engine, r.id)
    best = {"metric": "val/acc", "value": val_acc, "epoch": epochs} if epochs else None
    repo.finish_run(
        engine,
        r.id,
        status,
        summary={
            "status": status,
            "best": best,
            "epochs_run": epochs,
            "wall_time_s": 12.5,
            "parameters": 71754,
            **({"dataset_fingerprint": fingerprint} if fingerprint else {}),
        },
    )
    return repo.get_run(engine, r.id)


def seed_evaluation(engine: Engine, run_id: str) -> None:
    names = [str(i) for i in range(3)]
    repo.append_events(
        engine,
        run_id,
        [
            EventInput(
                "evaluation",
                "info",
                "epoch 1: val/acc 0.9",
                data={
                    "epoch": 1,
                    "confusion": [[5, 1, 0], [0, 6, 0], [1, 0, 4]],
                    "per_class_acc": [0.83, 1.0, 0.8],
                    "class_names": names,
                },
            ),
            EventInput(
                "diagnosis",
                "warning",
                "training loss is not decreasing",
                code="loss_not_decreasing",
                data={"code": "loss_not_decreasing", "advice": "Raise the learning rate or check the labels."},
            ),
        ],
    )


WIDGET_KINDS = ("number_input", "checkbox", "selectbox", "multiselect", "text_input", "toggle", "slider")


def widget(at: Any, key: str) -> Any:
    """The widget with this key, whatever its kind."""
    for kind in WIDGET_KINDS:
        try:
            return getattr(at, kind)(key=key)
        except KeyError:
            continue
    raise KeyError(key)


def error_beside(at: Any, key: str) -> str | None:
    """The error message shown right under the widget with `key` (in the same column), or None."""

    def walk(block: Any) -> str | None | bool:
        kids = list(getattr(block, "children", {}).values())
        for i, node in enumerate(kids):
            if getattr(node, "key", None) == key:
                after = kids[i + 1] if i + 1 < len(kids) else None
                return after.value if after is not None and after.type == "error" else None
            found = walk(node)
            if found is not False:
                return found
        return False

    found = walk(at.main)
    if found is False:
        raise KeyError(f"no widget with key {key!r} on the page")
    return found  # type: ignore[return-value]


def _decoded(value: Any) -> Any:
    """Plotly sends numpy arrays as {"dtype", "bdata" (base64), "shape"}: back to lists."""
    import base64

    import numpy as np

    if isinstance(value, dict) and "bdata" in value:
        arr = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
        if "shape" in value:
            arr = arr.reshape([int(n) for n in str(value["shape"]).split(",")])
        return arr.tolist()
    if isinstance(value, dict):
        return {k: _decoded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decoded(v) for v in value]
    return value


_SENT_SPECS: dict[str, str] = {}  # stamp -> figure: the live-chart component sends a figure once per session


def _live_specs(at: Any) -> list[str] | None:
    """The figures the live-chart components (app/live/chart.py) show, or None when one was sent in an
    earlier run this helper did not see (a refresh sends only the stamp of a figure the frame holds)."""
    import json

    specs = []
    for el in at.get("component_instance"):
        if el.proto.component_name.endswith("torchdeck_live_chart"):
            for chart in json.loads(el.proto.json_args)["charts"]:
                if chart["spec"] is not None:
                    _SENT_SPECS[chart["stamp"]] = chart["spec"]
                if chart["stamp"] not in _SENT_SPECS:
                    return None
                specs.append(_SENT_SPECS[chart["stamp"]])
    return specs


def plotly_figures(at: Any) -> dict[str, dict]:
    """The page's Plotly figures by title (the parallel-coordinates one as "parallel"): those of
    st.plotly_chart and those of the live-chart component. Where the component was sent a figure in a
    run not seen here, this asks for them all again as the browser would (the component's value, a
    new nonce) and reruns."""
    import json
    import uuid

    specs = [el.proto.spec for el in at.get("plotly_chart")]
    live = _live_specs(at)
    if live is None:
        for key in ("run.charts", "compare.live_charts"):
            at.session_state[key] = uuid.uuid4().hex
        at.run()
        live = _live_specs(at)
    specs += live
    out = {}
    for spec in specs:
        fig = _decoded(json.loads(spec))
        out[fig["layout"].get("title", {}).get("text", "parallel")] = fig
    return out
