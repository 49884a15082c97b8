"""The New run page's pre-flight panel: the shape check, the overfit-one-batch verdict (worker/preflight.py's
`overfit` entry) and the labelled sample grid, as a jobs worker answered them (app/services/jobs.preflight)."""

from __future__ import annotations

import math

import streamlit as st

from app.present import text as f

OVERFIT_HINT = (
    "A model that cannot memorise a handful of samples usually has a learning rate too low or too high "
    "for it (the check uses Adam at {lr:g}), labels misaligned with the images (compare the grid "
    "below), a frozen model ({trainable} of {parameters} parameters train), or outputs that do not "
    "suit the loss. Fix it before a long run."
)


def _loss(x: float) -> str:
    return "NaN" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3g}"


def _pct(x: float) -> str:
    return "?" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.0%}"


def overfit_message(r: dict, model: dict) -> tuple[str, str]:
    """(kind: success | warning | info, Markdown) saying whether the loss fell on one batch, and what a
    failure usually means."""
    if r.get("skipped"):
        return "info", f"Overfit one batch skipped: {f.md_text(r['skipped'])}."
    if r.get("error"):
        return "warning", f"Overfit one batch could not run: {f.md_text(r['error'], multiline=True)}"
    span = (
        f"from {_loss(r['initial_loss'])} to {_loss(r['final_loss'])} in {r['steps']} steps "
        f"(one batch of {r['batch']}, batch accuracy {_pct(r['batch_acc'])})"
    )
    if r.get("passed"):
        return "success", f"Overfit one batch passed: the loss fell {span}, so the model, loss and labels can learn."
    early = r["steps"] < r.get("max_steps", r["steps"])
    budget = (
        f" It stopped at its {r['budget_s']:g} s budget after {r['steps']} of {r['max_steps']} steps: "
        "on this CPU the check may be too short to tell (the run's `train.overfit_check` runs it on the "
        "run's device)."
        if early and r.get("budget_s")
        else ""
    )
    hint = OVERFIT_HINT.format(
        lr=r.get("lr", 0.0), trainable=f"{model.get('trainable', 0):,}", parameters=f"{model.get('parameters', 0):,}"
    )
    if r.get("fell"):
        head = f"Overfit one batch did not pass: the loss fell {span}, but the batch was not memorised."
    else:
        head = f"Overfit one batch failed: the loss did **not** fall, it went {span}."
    return "warning", f"{head}{budget}\n\n{hint}"


def show(result: dict) -> None:
    """The panel, in a bordered box."""
    with st.container(border=True):
        st.markdown("**Pre-flight**")
        if result.get("ok"):
            s = result["shapes"]
            st.success(
                f"Shape check passed: input {s['input_shape']} → output {s['output_shape']} "
                f"({s['num_classes']} classes)",
                icon=":material/check_circle:",
            )
        else:
            st.error(f.md_text(result.get("error", "pre-flight failed"), multiline=True), icon=":material/error:")
        if isinstance(result.get("overfit"), dict):
            kind, text = overfit_message(result["overfit"], result.get("model", {}))
            icon = {"success": ":material/check_circle:", "warning": ":material/warning:"}.get(kind, ":material/info:")
            getattr(st, kind)(text, icon=icon)
        if isinstance(result.get("imbalance"), dict):  # unbalanced classes, and what to do about them
            found = result["imbalance"]
            getattr(st, "info" if found.get("corrected") else "warning")(
                f.md_text(found.get("message", "unbalanced classes")), icon=":material/balance:"
            )
        if result.get("data"):
            d, m = result["data"], result.get("model", {})
            st.caption(
                f"data {f.md_text(d['name'])}: {d['train']} train / {d['val']} val, "
                f"{len(d['classes'])} classes, "
                f"{d['channels']}×{d['image_size']}×{d['image_size']}"
                + (f" · model {f.md_text(m['name'])}: {m['parameters']:,} parameters" if m else "")
            )
        if result.get("grid"):
            st.image(result["grid"], caption="Training samples with their labels: check they match")
