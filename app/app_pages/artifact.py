"""Artifact: a shareable download link, `/artifact?id=<opaque id>`.

The link names an artifact by its opaque id only; the service resolves the id through the database
to the artifact store, so no request can name a file path. Anything else — a path, an unknown id, a
file outside this installation's store — is refused with the reason, and nothing is read."""

from __future__ import annotations

import streamlit as st

from app import services
from app import fmt as f
from app.ui import frame, queries
from db.errors import ArtifactNotFound


def main() -> None:
    artifact_id = st.query_params.get("id", "")
    st.title("Artifact")
    if not artifact_id:
        st.info("Open a file from a run's **Artifacts** tab, or a link `/artifact?id=…` shared from there.",
                icon=":material/link:")
        return
    try:
        record, fh = services.open_artifact(artifact_id, engine=queries.engine())
    except services.InvalidArtifactId as e:
        st.error(f"Refused: {e}.", icon=":material/block:")
        return
    except ArtifactNotFound:
        st.error(f"Refused: there is no artifact with id `{artifact_id[:64]}`.", icon=":material/block:")
        return
    except services.ArtifactUnavailable as e:
        st.error(str(e), icon=":material/cloud_off:")
        return
    fh.close()  # opened to prove it is readable; the button reads it again when clicked
    run = queries.run(record.run_id)
    st.markdown(f"**{services.artifact_filename(record)}** · {record.kind} · {f.size(record.size)}"
                + (f" · sha256 `{record.sha256}`" if record.sha256 else ""))
    if run is not None:
        st.page_link(frame.RUN, label=f"from run {run.name}", query_params={"id": run.id},
                     icon=":material/monitoring:")
    st.download_button("Download", lambda: services.read_artifact(record.id, engine=queries.engine()),
                       file_name=services.artifact_filename(record), icon=":material/download:", key="artifact.dl",
                       type="primary")


main()
