"""The Run page's Predict tab: images dropped by the user (or a few of the run's dataset) classified by the run's
verified ONNX export, each with its top classes, the image the model saw and the server's time for it.

The model runs in the dashboard's process (app/services/predict.py says why and what bounds a request). Its ONNX
Runtime session is kept per artifact (id and SHA-256, so a re-export is a new entry) for a few exports at a time:
a session holds its weights in memory, so the cache is bounded by MAX_SESSIONS, the least recently used dropped.
Anyone who may view the run may predict, as anyone may download its files; nothing handed in is stored.
"""

from __future__ import annotations

import io

import streamlit as st

from app.present import text as f
from app.services import predict
from app.services.artifacts import ArtifactUnavailable, artifact_root
from app.services.paths import check_paths
from app.ui import external_view, frame, queries
from core import catalog
from core.config import RunSpec
from db.errors import ArtifactNotFound
from db.types import RunRecord

K = frame.page_state("run.predict")
MAX_SESSIONS = 4  # loaded exports kept at once: a resnet50's session is ~100 MB
DIGITS_SHOWN = 6  # images taken from the run's dataset per click
SEEN_WIDTH = 112  # pixels on the page of the image the model saw (an 8×8 digit is drawn larger)


@st.cache_resource(max_entries=MAX_SESSIONS, show_spinner="Loading the ONNX export…")
def _model(artifact_id: str, sha256: str) -> predict.Model:
    """The loaded export; `sha256` is in the key so that a file registered anew under an id is loaded anew."""
    return predict.load_model(artifact_id, queries.engine())


def show(r: RunRecord) -> None:
    if r.external:  # no export of torchdeck's to run
        external_view.not_applicable("predict")
        return
    onnx, why = predict.verified_onnx(r.status, queries.artifacts(r.id))
    if onnx is None:
        st.info(f.md_text(why), icon=":material/info:")
        if r.finished:
            st.caption(
                "**Export now** in the **Artifacts** tab makes a verified ONNX export (the run's owner or an admin)."
            )
        return
    try:
        model = _model(onnx.id, onnx.sha256 or "")
    except (ArtifactUnavailable, ArtifactNotFound) as e:
        st.error(f"The ONNX export cannot be read: {f.md_text(e)}", icon=":material/error:")
        return
    except Exception as e:  # noqa: BLE001 - a file ONNX Runtime cannot load: said in its words, never a traceback
        st.error(f"ONNX Runtime cannot load the export: {f.md_text(str(e)[:300])}", icon=":material/error:")
        return
    st.caption(
        f"The verified ONNX export ({onnx.created_at:%Y-%m-%d %H:%M}, sha256 {f.code_span((onnx.sha256 or '')[:12])}) "
        f"run by ONNX Runtime on this server's CPU, with the training's preprocessing. Up to {predict.MAX_FILES} "
        f"images of up to {predict.MAX_FILE_BYTES // 2**20} MB each; nothing is stored."
    )
    files = st.file_uploader(
        "Images to classify",
        accept_multiple_files=True,
        key=K(f"files.{r.id}"),
        max_upload_size=predict.MAX_FILE_BYTES // 2**20,
        help="Any image Pillow reads (PNG, JPEG, BMP, GIF, WebP, TIFF); each is converted, resized and centre-cropped "
        "as the training did.",
    )
    truths: dict[str, str] = {}
    handed = [(u.name, u) for u in files or []]
    if handed:
        shown = predict.predict_many(model, handed)
    else:
        taken = dataset_samples(r)
        shown = predict.predict_many(model, [(n, io.BytesIO(b)) for n, b, _ in taken])
        truths = {n: t for n, _, t in taken}
    for p in shown:
        result(p, truths.get(p.name))


def dataset_samples(r: RunRecord) -> list[tuple[str, bytes, str]]:
    """A few images of the run's dataset (the builtin digits, or an image folder or zip this server can read and the
    run may) when the user asks; else why not."""
    data = (r.spec or {}).get("data") or {}
    folder = catalog.is_folder(data.get("name")) and bool(data.get("path"))
    if data.get("name") != "digits" and not folder:
        st.caption(
            f"Images from the run's dataset ({f.md_text(data.get('name', 'unknown'))}) are not offered here: "
            "the dashboard reads the builtin digits and image folders. Drop images above."
        )
        return []
    key = K(f"digits.{r.id}")
    if st.button(f"Take {DIGITS_SHOWN} images from the dataset", icon=":material/casino:", key=K(f"take.{r.id}")):
        st.session_state[key] = st.session_state.get(key, -1) + 1
    if key not in st.session_state:
        return []
    if not folder:
        return predict.digits_samples(DIGITS_SHOWN, seed=st.session_state[key])
    try:  # the folder a run may read (its owner's uploads, the allowed roots), as the run's own check says today
        spec = check_paths(RunSpec.model_validate(dict(r.spec)), queries.engine(), artifact_root())
        return predict.folder_samples(spec.data.path or "", DIGITS_SHOWN, seed=st.session_state[key])
    except (ValueError, OSError) as e:
        st.warning(
            f"The run's dataset cannot be read on this server: {f.md_text(str(e)[:300])}. Drop images above.",
            icon=":material/folder_off:",
        )
        return []


def result(p: predict.Prediction, truth: str | None) -> None:
    """One image's answer: the class, its probability and the time; the image the model saw; the top classes."""
    with st.container(border=True):
        if p.error is not None:
            st.error(f"{f.md_text(p.name)}: {f.md_text(p.error)}", icon=":material/block:")
            return
        best, prob = p.top[0]
        left, right = st.columns([1, 3])
        left.image(p.seen, width=SEEN_WIDTH, caption="what the model saw", clamp=True)
        with right:
            st.markdown(
                f"{f.md_text(p.name)} → **{f.md_text(best)}** {prob:.1%} · {p.latency_ms:.3g} ms"
                + (f" · true class {f.code_span(truth)}" if truth is not None else "")
            )
            for cls, q in p.top:  # the top classes, as bars: a table's grid is drawn later than the page
                st.progress(q, text=f"{f.md_text(cls)} · {q:.1%}")
