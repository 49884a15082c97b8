"""A run's artifacts as the dashboard serves them: this host's run root and the artifact store, the newest
artifact of each kind, and an artifact read or streamed by its opaque id only (never a path), checked against the
SHA-256 and size it was registered with (the download route, app/web/downloads.py, streams them)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from app.services.broker import get_engine
from db.repo import ArtifactRecord


def latest_by_kind(artifacts: list[ArtifactRecord]) -> dict[str, ArtifactRecord]:
    """Exports can be made again; the newest artifact of each kind wins."""
    out: dict[str, ArtifactRecord] = {}
    for a in sorted(artifacts, key=lambda a: a.created_at):
        out[a.kind] = a
    return out


def artifact_root() -> Path:
    """This host's run root: the artifact store's folder when it is local, else a local working copy."""
    from db.artifacts import local_run_root

    return local_run_root()


def artifact_store():
    """The artifact store of $TORCHDECK_ARTIFACTS (a folder by default, or s3://bucket/prefix)."""
    from db.artifacts import open_store

    return open_store()


_ARTIFACT_ID = re.compile(r"^[0-9A-Za-z_-]{1,64}$")


class InvalidArtifactId(ValueError):
    """An artifact id that is not one: ids are opaque tokens, never paths."""


class ArtifactUnavailable(LookupError):
    """The artifact is registered but its bytes cannot be read from this host."""


class ArtifactChanged(ArtifactUnavailable):
    """The bytes behind an artifact id are not those it was registered with (sha256 or size): never served."""


def _artifact_record(artifact_id: str, engine: Engine | None):
    from db.repo import get_artifact

    if not isinstance(artifact_id, str) or not _ARTIFACT_ID.match(artifact_id):
        raise InvalidArtifactId(
            f"{str(artifact_id)[:80]!r} is not an artifact id: downloads name an artifact by its "
            "opaque id (letters and digits), never by a path"
        )
    return get_artifact(engine or get_engine(), artifact_id)  # ArtifactNotFound for an unknown id


def _artifact_source(record) -> tuple[Any, str | None, Path | None]:
    """(store, key, None) when the artifact is in the store; (None, None, path) for a file a run registered
    under this host's run root; ArtifactUnavailable otherwise. Only the database's URI decides, and never
    anything else of the data folder (it holds the database and the sign-in secrets)."""
    from urllib.parse import unquote, urlparse

    store = artifact_store()
    key = store.key_of(record.uri)
    if key is not None:
        return store, key, None
    parsed = urlparse(record.uri)
    if parsed.scheme in ("file", ""):
        path = Path(unquote(parsed.path)).resolve()
        if artifact_root() in path.parents:
            return None, None, path
    raise ArtifactUnavailable(
        f"artifact {record.id} ({record.kind}) is stored at {record.uri}, outside this "
        f"installation's artifact store ({store.url}): it cannot be downloaded here"
    )


def artifact_problem(record) -> str | None:
    """Why an artifact cannot be downloaded here (cheap: no request to an object store, no hashing; a file
    changed without changing its size is refused by the download itself), or None."""
    try:
        store, key, path = _artifact_source(record)
    except ArtifactUnavailable:
        return "not on this machine nor in this installation's artifact store"
    local = path if path is not None else store.local_path(key)
    if local is None:
        return None
    if not local.is_file():
        return "file removed from the artifact store"
    size = local.stat().st_size
    if record.size is not None and size != record.size:
        return f"file changed since it was stored ({size} bytes, {record.size} stored): not served"
    return None


def artifact_filename(record) -> str:
    """The file's own name (a file: URI's last part decoded: `ré sumé.json`, not `r%C3%A9%20sum%C3%A9.json`)."""
    from urllib.parse import unquote

    name = record.uri.rstrip("/").rsplit("/", 1)[-1]
    name = unquote(name) if record.uri.startswith("file:") else name
    return name or f"{record.kind}-{record.id}"


def open_artifact(artifact_id: str, engine: Engine | None = None):
    """(record, binary file) of an artifact given only its opaque id: streamed from the artifact store
    (local folder or bucket). InvalidArtifactId for anything path-like, db ArtifactNotFound for an
    unknown id, ArtifactUnavailable when its bytes are not reachable from here. The file hashes what it
    serves: the read that completes it raises ArtifactChanged instead when the bytes are not the ones
    registered (the row's sha256 and size). Close the file."""
    from db.artifacts import VerifiedReader

    record = _artifact_record(artifact_id, engine)
    store, key, path = _artifact_source(record)
    try:
        raw = store.open(key) if store is not None else open(path, "rb")  # noqa: SIM115 - the caller closes it
    except FileNotFoundError:
        raise ArtifactUnavailable(
            f"artifact {record.id} ({record.kind}) is registered but its file is gone ({record.uri})"
        ) from None

    return record, VerifiedReader(raw, record.size, record.sha256, lambda why: _changed(record, why))


def _changed(record, why: str) -> ArtifactChanged:
    return ArtifactChanged(
        f"artifact {record.id}'s file changed since it was stored: {why}; the download "
        f"is refused ({record.kind}, {record.uri})"
    )


def read_artifact(artifact_id: str, engine: Engine | None = None) -> bytes:
    """The whole artifact, checked against its sha256 on the way: ArtifactChanged when it differs; other errors
    as open_artifact. Held whole in memory: for the small files the pages show (a sample grid, an error
    analysis); a download streams (artifact_pieces, app/web/downloads.py)."""
    _, f = open_artifact(artifact_id, engine)
    with f:
        return f.read()


DOWNLOAD_PIECE = 1 << 20


def artifact_pieces(artifact_id: str, engine: Engine | None = None):
    """(record, an iterator of its bytes in DOWNLOAD_PIECE pieces) for a download that holds one piece at a time.
    A file on this host is hashed first, piece by piece: ArtifactChanged before a byte is served when it is not
    the registered one. Then (a bucket's file too, which is not read twice) the pieces come through
    open_artifact's check, whose last piece raises ArtifactChanged instead when the bytes changed meanwhile: the
    download breaks off before its end. Other errors as open_artifact, before the first piece."""
    from db.artifacts import file_sha256

    record, reader = open_artifact(artifact_id, engine)
    try:
        store, key, path = _artifact_source(record)
        local = path if path is not None else store.local_path(key)
        if local is not None:
            size, digest = file_sha256(local)
            if record.size is not None and size != record.size:
                raise _changed(record, f"{size} bytes ≠ {record.size} stored")
            if record.sha256 and digest != record.sha256:
                raise _changed(record, f"sha256 {digest} ≠ {record.sha256}")
    except BaseException:
        reader.close()
        raise

    def pieces():
        with reader:
            while piece := reader.read(DOWNLOAD_PIECE):
                yield piece

    return record, pieces()
