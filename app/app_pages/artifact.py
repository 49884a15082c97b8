"""Artifact: a shareable download link, `/artifact?id=<opaque id>`.

The link names an artifact by its opaque id only; the service resolves the id through the database
to the artifact store, so no request can name a file path. Anything else — a path, an unknown id, a
file outside this installation's store, a file whose bytes are not the ones registered (its sha256,
checked by the download itself; a changed size is seen here already) — is refused with the reason.
The download streams the file through the dashboard's download route (app/web/downloads.py): never whole in
the dashboard's memory. An artifact of a run of a project the user may not read is answered as one that does not
exist; one they may read opens its run's project."""

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
from app.ui import frame, project_context, queries
from app.web import downloads
from db import repo
from db.errors import ArtifactNotFound


def readable(run_id: str) -> bool:
    """Whether the acting user may see the run of an artifact (its project's viewers, maintainers, admins)."""
    run = queries.run(run_id)
    return run is not None and project_context.may_read(run.project)


def not_found(artifact_id: str) -> None:
    st.error(f"Refused: there is no artifact with id {f.code_span(artifact_id[:64])}.", icon=":material/block:")


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
        not_found(artifact_id)
        return
    except ArtifactUnavailable as e:
        if readable(repo.get_artifact(queries.engine(), artifact_id).run_id):
            st.error(f.md_text(e), icon=":material/cloud_off:")
        else:  # of a project the user may not read: not even that it exists
            not_found(artifact_id)
        return
    fh.close()  # opened to prove it is readable; the download reads it again
    if not readable(record.run_id):  # the same words as an artifact that does not exist
        not_found(artifact_id)
        return
    problem = artifact_problem(record)  # e.g. its size is not the stored one: refused here already
    if problem is not None:
        st.error(f"Refused: artifact {f.code_span(record.id)}: {f.md_text(problem)}.", icon=":material/gpp_bad:")
        return
    run = queries.run(record.run_id)
    if run is not None:
        project_context.follow(run.project)  # a shared link opens the run's project
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
