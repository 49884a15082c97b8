"""Datasets: upload an ImageFolder zip (checked, stored under $TORCHDECK_HOME/datasets), preview it,
and see the built-in datasets."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from app import auth, charts, services
from app import datasets as ds
from app import fmt as f
from app.ui import frame, queries

K = frame.page_state("ds")


def upload_form() -> None:
    with st.form(K("upload_form"), clear_on_submit=True):
        st.markdown(f"**Upload an ImageFolder zip** — one folder per class (`cat/1.jpg`, `dog/2.png`), optionally "
                    f"inside one top folder; at most {ds.MAX_UPLOAD_MB} MB.")
        name = st.text_input("Dataset name", key=K("name"), placeholder="e.g. pets")
        upload = st.file_uploader("Zip file", type=["zip"], key=K("file"), max_upload_size=ds.MAX_UPLOAD_MB)
        submitted = st.form_submit_button("Upload and check", icon=":material/upload:")
    if not submitted:
        return
    if upload is None or not name:
        st.error("Give the dataset a name and choose a zip file.", icon=":material/error:")
        return
    with st.spinner("Checking and extracting…"):
        try:
            record = ds.store_upload(queries.engine(), name, upload, upload.size, owner=auth.current_user().id)
        except ds.UploadRefused as e:
            st.error(f"Upload refused: {f.md_text(e)}", icon=":material/block:")  # it names the zip's files
            return
    queries.clear()
    st.session_state[K("pick")] = record.name
    total = sum(record.counts.values())
    st.success(f"Stored {f.md_text(record.name)}: {total} images in {len(record.classes)} classes. Runs use it as "
               f"data.name=imagefolder, data.path={f.code_span(record.uri)}", icon=":material/check_circle:")


def preview(record) -> None:
    folder = Path(record.uri)
    st.markdown(f"**{f.md_text(record.name)}** · {f.code_span(record.uri)} · {sum(record.counts.values())} images · "
                f"{len(record.classes)} classes")
    left, right = st.columns([1, 1])
    counts = dict(sorted(record.counts.items()))
    left.plotly_chart(charts.bar_figure("Images per class", list(counts), list(counts.values()), y_title="images",
                                        uirevision=f"ds:{record.id}"), key=K(f"counts.{record.id}"))
    with right:
        files = list(ds.preview_files(folder))
        if not files:
            st.caption("The stored folder is not on this machine.")
        cols = st.columns(4)
        for i, (cls, path) in enumerate(files[:24]):
            cols[i % 4].image(str(path), caption=f.md_text(cls), width="stretch")  # a caption renders Markdown
    st.code(f"data:\n  name: imagefolder\n  path: {record.uri}", language="yaml")
    user = auth.current_user()
    if not auth.can_modify(user, record):
        st.caption("Only its owner or an admin may delete this dataset.")
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


def main() -> None:
    st.title("Datasets")
    upload_form()
    st.subheader("Uploaded")
    records = queries.datasets()
    if not records:
        st.caption("No uploaded datasets yet.")
    else:
        owners = services.owner_labels((d.owner for d in records), engine=queries.engine())
        df = pd.DataFrame([{"name": d.name, "status": d.status, "classes": len(d.classes),
                            "images": sum(d.counts.values()), "owner": owners.get(d.owner, ""), "created": d.created_at,
                            "folder": d.uri,
                            "error": d.error or ""} for d in records])
        st.dataframe(df, hide_index=True, width="stretch")
        names = [d.name for d in records]
        if st.session_state.get(K("pick")) not in names:
            st.session_state[K("pick")] = names[0]
        chosen = st.selectbox("Preview", names, key=K("pick"))
        preview(next(d for d in records if d.name == chosen))
    st.subheader("Built in")
    st.dataframe(pd.DataFrame(ds.builtin_datasets()), hide_index=True, width="stretch")


main()
