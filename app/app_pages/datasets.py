"""Datasets: the current project's uploaded datasets (an ImageFolder zip, checked, stored under
$TORCHDECK_HOME/datasets; its members upload to it), preview them, see the built-in datasets, and this machine's
image cache (app/ui/image_cache_view.py)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import auth
from app.present import builtin_datasets as builtin
from app.present import figures
from app.present import text as f
from app.services import datasets as ds
from app.services.owners import owner_labels
from app.ui import frame, image_cache_view, project_context, queries

K = frame.page_state("ds")


def _uploader_key() -> str:
    """The uploader's key: a new one after each stored upload, which empties it."""
    gen = st.session_state.get(K("gen"), 0)
    return K("file") if not gen else K(f"file.{gen}")


def _name_from_zip() -> None:
    """A zip was chosen: when the name box is empty (or still holds the previous zip's default), its file name."""
    upload = st.session_state.get(_uploader_key())
    name = st.session_state.get(K("name"), "")
    if upload is None or (name and name != st.session_state.get(K("auto"))):
        return
    taken = [d.name for d in queries.datasets()]  # every project's: a dataset's name is unique in the database
    st.session_state[K("name")] = st.session_state[K("auto")] = ds.default_name(upload.name, taken)


def upload_form() -> None:
    """The upload to the current project, for its members, maintainers and admins."""
    if not project_context.may_contribute():
        st.caption(
            f"You are a viewer of project {f.md_text(project_context.project())}: its members upload datasets to it."
        )
        return
    stored = st.session_state.pop(K("stored"), None)
    if stored:
        st.session_state[K("name")] = ""  # before the widget: a stored upload empties the form
    with st.container(border=True):
        st.markdown(
            f"**Upload an ImageFolder zip** to project {f.md_text(project_context.project())} — one folder per "
            f"class (`cat/1.jpg`, `dog/2.png`), optionally inside one top folder; at most {ds.MAX_UPLOAD_MB} MB."
        )
        name = st.text_input(
            "Dataset name",
            key=K("name"),
            placeholder="e.g. pets",
            help="Letters, digits, '-', '_' and '.'; the zip's file name unless you give one.",
        )
        upload = st.file_uploader(
            "Zip file", type=["zip"], key=_uploader_key(), on_change=_name_from_zip, max_upload_size=ds.MAX_UPLOAD_MB
        )
        submitted = st.button("Upload and check", icon=":material/upload:", key=K("submit"))
    if stored:
        st.success(stored, icon=":material/check_circle:")
    if submitted:
        store(name, upload)


def store(name: str, upload) -> None:
    if upload is None:
        st.error("Choose a zip file (and give the dataset a name).", icon=":material/error:")
        return
    name = name.strip() or ds.default_name(upload.name, [d.name for d in queries.datasets()])
    with st.spinner("Checking and extracting…"):
        try:
            record = ds.store_upload(
                queries.engine(),
                name,
                upload,
                upload.size,
                owner=project_context.acting().id,
                project=project_context.project(),
            )
        except (ds.UploadRefused, auth.PermissionDenied) as e:
            st.error(f"Upload refused: {f.md_text(e)}", icon=":material/block:")  # it names the zip's files
            return
    queries.clear()
    st.session_state[K("pick")] = record.name
    total = sum(record.counts.values())
    st.session_state[K("stored")] = (
        f"Stored {f.md_text(record.name)}: {total} images in {len(record.classes)} classes. Runs use it as "
        f"data.name=imagefolder, data.path={f.code_span(record.uri)}"
    )
    st.session_state[K("gen")] = st.session_state.get(K("gen"), 0) + 1
    st.rerun()


def train_link(dataset: str) -> None:
    """Opens New run with `dataset` chosen: a built-in's name, or an uploaded dataset's name."""
    st.page_link(
        frame.NEW, label="Train on this dataset", query_params={"dataset": dataset}, icon=":material/model_training:"
    )


def thumbnails(record) -> None:
    """The dataset's preview thumbnails (small files made once at upload, app/services/dataset_previews.py), never its
    images: decoding a few 64-megapixel photos at every page run took seconds."""
    if ds.previews_made(record.uri):
        made = ds.previews(record.uri)
    else:  # uploaded before thumbnails existed: made now, once
        with st.spinner("Making the preview's thumbnails (once)…"):
            made = ds.previews(record.uri)
    if made is None:
        st.caption("The stored folder is not on this machine.")
        return
    cols = st.columns(4)
    for i, (cls, path) in enumerate(made.shown):
        cols[i % 4].image(str(path), caption=f.md_text(cls), width="stretch")  # a caption renders Markdown
    if made.left_out:
        st.caption(
            f"{made.left_out} image(s) not previewed: making their thumbnails would cost too much (runs "
            "train on them as usual)."
        )


def preview(record) -> None:
    st.markdown(
        f"**{f.md_text(record.name)}** · {f.code_span(record.uri)} · {sum(record.counts.values())} images · "
        f"{len(record.classes)} classes"
    )
    left, right = st.columns([1, 1])
    counts = dict(sorted(record.counts.items()))
    left.plotly_chart(
        figures.bar_figure(
            "Images per class", list(counts), list(counts.values()), y_title="images", uirevision=f"ds:{record.id}"
        ),
        key=K(f"counts.{record.id}"),
    )
    with right:
        thumbnails(record)
    st.code(f"data:\n  name: imagefolder\n  path: {record.uri}", language="yaml")
    if record.status == "ready" and project_context.may_contribute(record.project):
        train_link(record.name)
    user = project_context.acting()
    if not auth.can_modify(user, record):
        st.caption(
            "Only its owner (a member of the project), a maintainer of the project or an admin may delete this dataset."
        )
        return
    with st.popover("Delete this dataset", icon=":material/delete:"):
        st.warning(f"Delete {f.md_text(record.name)} and its stored images? Runs that use it will fail to load it.")
        if st.button("Delete permanently", type="primary", key=K(f"del.{record.id}")):
            try:
                ds.remove(queries.engine(), record.id, by=user)
            except auth.PermissionDenied as e:
                st.error(f.md_text(e), icon=":material/block:")
                return
            queries.clear()
            st.rerun()


@st.cache_data(show_spinner=False)
def digits_samples() -> tuple[bytes, dict[str, int]]:
    return builtin.digits_samples()


def builtin_section() -> None:
    st.subheader("Built in")
    rows = ds.builtin_datasets()
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
    # None until one is chosen: digits' preview loads scikit-learn's copy, which no page load should wait for.
    name = st.selectbox(
        "Preview a built-in dataset",
        [r["name"] for r in rows],
        index=None,
        key=K("builtin"),
        placeholder="Choose one to preview it or train on it",
    )
    if name is None:
        return
    if name == "digits":
        grid, counts = digits_samples()
        st.markdown(
            f"**digits** · scikit-learn's load_digits · {sum(counts.values()):,} images · {len(counts)} "
            "classes · 8×8 gray"
        )
        left, right = st.columns([1, 1])
        left.plotly_chart(
            figures.bar_figure(
                "Images per class", list(counts), list(counts.values()), y_title="images", uirevision="ds:digits"
            ),
            key=K("counts.digits"),
        )
        right.image(grid, caption="The first 8 images of each digit, one row per class (enlarged 4×)")
    elif name == "synthetic":
        st.markdown(builtin.synthetic_description())
        counts = builtin.synthetic_counts()
        st.plotly_chart(
            figures.bar_figure(
                "Images per class with the defaults",
                list(counts),
                list(counts.values()),
                y_title="images",
                uirevision="ds:synthetic",
                height=260,
            ),
            key=K("counts.synthetic"),
        )
    elif builtin.is_torchvision(name):
        st.markdown(builtin.torchvision_description(name))
    st.code(f"data:\n  name: {name}", language="yaml")
    if project_context.may_contribute():
        train_link(name)


def main() -> None:
    st.title("Datasets")
    upload_form()
    st.subheader("Uploaded")
    records = queries.datasets(project_context.project())
    if not records:
        st.caption(f"No uploaded datasets yet in project {f.md_text(project_context.project())}.")
    else:
        owners = owner_labels((d.owner for d in records), engine=queries.engine())
        df = pd.DataFrame(
            [
                {
                    "name": d.name,
                    "status": d.status,
                    "classes": len(d.classes),
                    "images": sum(d.counts.values()),
                    "owner": owners.get(d.owner, ""),
                    "created": d.created_at,
                    "folder": d.uri,
                    "error": d.error or "",
                }
                for d in records
            ]
        )
        st.dataframe(df, hide_index=True, width="stretch")
        names = [d.name for d in records]
        if st.session_state.get(K("pick")) not in names:
            st.session_state[K("pick")] = names[0]
        chosen = st.selectbox("Preview", names, key=K("pick"))
        preview(next(d for d in records if d.name == chosen))
    builtin_section()
    image_cache_view.section()


main()
