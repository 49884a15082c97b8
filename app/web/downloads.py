"""Artifact downloads streamed over HTTP: `GET /_torchdeck/download/<artifact id>`.

Streamlit's download button holds the whole file in the dashboard's memory (its media store keeps bytes,
whatever it is handed: bytes, a file, a callable), once per click: a 2 GB checkpoint was 2 GB of the
dashboard's memory for every person downloading it. This route streams the file instead, a piece
(app.services.artifacts.DOWNLOAD_PIECE, 1 MB) at a time, and re-checks its SHA-256 on the way: a file on this host is
hashed before its first byte is sent (refused with 409 and both hashes when it changed), and the pieces are
hashed as they are sent, so a file changed meanwhile (or one in a bucket) breaks the download off before its
end (app.services.artifacts.artifact_pieces).

Access is that of the pages: by opaque artifact id only (app.services.artifacts resolves it through the database to the
artifact store; never a path), and only for someone a page would admit: local mode, this machine, not
through a proxy (auth.local_refusal; app/web/front_door.py's front door also checks Host and Origin); team mode,
a member signed in (the request's sign-in cookie, as Streamlit's own websocket reads it, not older than
TORCHDECK_SESSION_MAX_AGE_H) who may read the project of the artifact's run (app/web/access.py; to anyone else the
artifact does not exist: the same 404 and words as an unknown id). The file is always an attachment of type
application/octet-stream (never shown inline in the dashboard's origin).

The route exists where app/server.py mounts `routes()` (`torchdeck ui` / `torchdeck up`); elsewhere
(`streamlit run app/main.py`, tests) `served()` is false and the pages fall back on Streamlit's button for
files up to FALLBACK_MAX_BYTES. Nothing of the dashboard is imported before the first request (see
app/server.py: caches made before Streamlit's runtime exists would get a storage of their own).
"""

from __future__ import annotations

import os
import re
from urllib.parse import quote

from app import auth
from app.web import front_door

PATH = "/_torchdeck/download"
SERVED_ENV = "TORCHDECK_DOWNLOAD_ROUTE"
FALLBACK_MAX_BYTES = 64 << 20


def routes() -> list:
    """For st.App(routes=...); says to this process's pages that the route is there."""
    from starlette.routing import Route

    os.environ[SERVED_ENV] = "1"
    return [Route(PATH + "/{artifact_id}", download, methods=["GET"])]


def served() -> bool:
    return os.environ.get(SERVED_ENV) == "1"


def url(artifact_id: str) -> str:
    return f"{PATH}/{quote(artifact_id, safe='')}"


def admitted(request) -> tuple[auth.User | None, str | None]:
    """(who downloads, None) for a request the pages' gate would admit (local mode: the local user; team mode: the
    signed-in member), else (None, why it is refused). What they may download is then up to their projects
    (app/web/access.py)."""
    try:
        team = auth.team_mode()
    except auth.AuthNotConfigured as e:
        return None, str(e)
    if not team:
        why = auth.local_refusal(request.client.host if request.client else None, request.headers)
        return (None, why) if why else (auth.local_user(), None)
    user = front_door.signed_in_user(request)
    if user is None:
        return None, "Sign in to the dashboard first (this download link works for signed-in members)."
    if not auth.is_member(user):
        why = f"{user.describe()} is not a member of this torchdeck: ask an admin ({auth.ADMINS_ENV}) to add you."
        return None, why
    return user, None


def _plain(status: int, text: str):
    from starlette.responses import PlainTextResponse

    return PlainTextResponse(
        text + "\n", status_code=status, headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
    )


def attachment(filename: str) -> str:
    """A Content-Disposition that names the file (RFC 6266: a plain ASCII name, and the exact one encoded)."""
    plain = re.sub(r"[^A-Za-z0-9._-]", "_", filename)[:200] or "artifact"
    return f"attachment; filename=\"{plain}\"; filename*=UTF-8''{quote(filename[:200], safe='')}"


def download(request):
    """The route: the artifact's bytes streamed, or a plain-text refusal (403, 400, 404, 409). An artifact of a run
    in a project the person may not read is answered as one that does not exist."""
    user, why = admitted(request)
    if why is not None:
        return _plain(403, why)
    artifact_id = request.path_params["artifact_id"]
    if not _readable(user, artifact_id):
        return _missing(artifact_id)
    return stream(artifact_id)


def _readable(user: auth.User | None, artifact_id: str) -> bool:
    """Whether `user` may read the project of the artifact's run (an id that names no artifact: stream() answers)."""
    if not auth.team_mode():
        return True
    from app.services.broker import get_engine
    from app.web import access
    from db.errors import ArtifactNotFound
    from db.repo import get_artifact

    engine = get_engine()
    try:
        record = get_artifact(engine, artifact_id)
    except ArtifactNotFound:
        return True
    return access.may_read(user, "run", record.run_id, engine)


def _missing(artifact_id: str):
    return _plain(404, f"Refused: there is no artifact with id {artifact_id[:64]!r}.")


def stream(artifact_id: str, filename: str | None = None):
    """The artifact's bytes as the route answers (a request already admitted): streamed, re-checked against its
    SHA-256, an attachment named `filename` (default its own name); or a plain-text refusal (400, 404, 409). The
    model registry's stable links (app/web/model_downloads.py) answer through it too."""
    from starlette.responses import StreamingResponse

    from app.services import artifacts
    from db.errors import ArtifactNotFound

    try:
        record, pieces = artifacts.artifact_pieces(artifact_id)
    except artifacts.InvalidArtifactId as e:
        return _plain(400, f"Refused: {e}.")
    except ArtifactNotFound:
        return _missing(artifact_id)
    except artifacts.ArtifactChanged as e:
        return _plain(409, f"Refused: {e}.")
    except (artifacts.ArtifactUnavailable, OSError) as e:
        return _plain(404, str(e))
    headers = {
        "Content-Disposition": attachment(filename or artifacts.artifact_filename(record)),
        "Cache-Control": "no-store",
        "X-Content-Type-Options": "nosniff",
    }
    if record.size is not None:
        headers["Content-Length"] = str(record.size)
    return StreamingResponse(pieces, media_type="application/octet-stream", headers=headers)


def control(record, *, key: str, label: str = "Download", **button) -> None:
    """A page's download control for an artifact whose checks passed (artifacts.artifact_problem): a link to the
    route where it is served; else Streamlit's button for a file up to FALLBACK_MAX_BYTES (it holds the file
    in memory), and a note saying why not for a larger one."""
    import streamlit as st

    from app.present import text as f
    from app.services import artifacts
    from app.ui import queries

    if served():
        st.link_button(label, url(record.id), icon=":material/download:", **button)
    elif record.size is not None and record.size <= FALLBACK_MAX_BYTES:
        st.download_button(
            label,
            lambda: artifacts.read_artifact(record.id, engine=queries.engine()),
            file_name=artifacts.artifact_filename(record),
            icon=":material/download:",
            key=key,
            **button,
        )
    else:
        st.caption(
            f"{f.size(record.size) if record.size is not None else 'A file of unknown size'}: downloaded "
            "through the dashboard's download route, which `torchdeck ui` and `torchdeck up` serve (this "
            f"dashboard was started without it, and holds files in memory up to {f.size(FALLBACK_MAX_BYTES)})."
        )
