"""Artifact: a shareable download link, `/artifact?id=<opaque id>`.

The link names an artifact by its opaque id only; the service resolves the id through the database
to the artifact store, so no request can name a file path. Anything else — a path, an unknown id, a
file outside this installation's store, a file whose bytes are not the ones registered (its sha256,
checked by the download itself; a changed size is seen here already) — is refused with the reason.
The download streams the file through the dashboard's download route (app/web/downloads.py): never whole in
the dashboard's memory."""

from __future__ import annotations

import streamlit as st

from app.present import text as f
from app.services.artifacts import (
    ArtifactUnavailable,
    InvalidArtifactId,
    artifact_filename,
    artifact_problem,
    open_artifact,
)
from app.ui import frame, queries
from app.web import downloads
from db.errors import ArtifactNotFound


def main() -> None:
    artifact_id = st.query_params.get("id", "")
    st.title("Artifact")
    if not artifact_id:
        st.info(
            "Open a file from a run's **Artifacts** tab, or a link `/artifact?id=…` shared from there.",
            icon=":material/link:",
        )
        return
    try:
        record, fh = open_artifact(artifact_id, engine=queries.engine())
    except InvalidArtifactId as e:
        st.error(f"Refused: {f.md_text(e)}.", icon=":material/block:")  # it quotes the link's id: text
        return
    except ArtifactNotFound:
        st.error(f"Refused: there is no artifact with id {f.code_span(artifact_id[:64])}.", icon=":material/block:")
        return
    except ArtifactUnavailable as e:
        st.error(f.md_text(e), icon=":material/cloud_off:")
        return
    fh.close()  # opened to prove it is readable; the download reads it again
    problem = artifact_problem(record)  # e.g. its size is not the stored one: refused here already
    if problem is not None:
        st.error(f"Refused: artifact {f.code_span(record.id)}: {f.md_text(problem)}.", icon=":material/gpp_bad:")
        return
    run = queries.run(record.run_id)
    st.markdown(
        f"**{f.md_text(artifact_filename(record))}** · {f.md_text(record.kind)} · {f.size(record.size)}"
        + (f" · sha256 {f.code_span(record.sha256)}" if record.sha256 else "")
    )
    if run is not None:
        st.page_link(
            frame.RUN,
            label=f"from run {f.md_text(run.name)}",
            query_params={"id": run.id},
            icon=":material/monitoring:",
        )
    downloads.control(record, key="artifact.dl", type="primary")


main()
