"""A run's files and the artifact store (db.artifacts).

Training writes into a local run directory (`<run root>/runs/<id>/`). When the store is that same
local folder nothing is copied. Otherwise (an S3 bucket, or a shared folder elsewhere) an
`Uploader` thread copies the files to `runs/<id>/<path in the run dir>`:
- checkpoints as soon as they change on disk (so a run lost with its host resumes elsewhere),
- every file the run registers as an artifact (checkpoints at the end, exports, export.json,
  bundle.zip, the sample grid), after which the sink records it with the store's URI, size and sha256.
  Export files are never written over an existing key (KeyExists: the upload is refused and reported),
  so the bytes behind an export's artifact id never change; "Export now" writes each export into a
  folder of its own (worker/export_job.py).
Uploads run beside the training loop and the database sink, never blocking either.

`fetch_checkpoints` brings `last.pt`/`best.pt` back before a resume on a host that lacks them, and
`localize_dataset` makes an uploaded ImageFolder dataset (stored as `datasets/<name>.zip`) readable
on a worker host that does not have the app's folder.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.names import CHECKPOINT_FILES, EXPORT_EXTRAS, EXPORT_FORMATS
from db.artifacts import CHUNK, ArtifactStore, BadKey, KeyExists, StoredObject, file_sha256

log = logging.getLogger("torchdeck.artifacts")

CHECKPOINTS = (CHECKPOINT_FILES["last"], CHECKPOINT_FILES["best"])
UPLOAD_ATTEMPTS = 4
EXPORT_KINDS = frozenset((*EXPORT_FORMATS, *EXPORT_EXTRAS.values()))  # uploaded once, never over a stored key


def dataset_key(name: str) -> str:
    return f"datasets/{name}.zip"


def run_key(run_id: str, rel: str = "") -> str:
    return f"runs/{run_id}" + (f"/{rel}" if rel else "")


def needs_upload(store: ArtifactStore, run_dir: Path) -> bool:
    """False on the fast path: the run directory already lies inside a local store."""
    return store.key_for_local(run_dir / "probe") is None


class Uploader:
    """Copies one run's files to the store in a background thread (see the module docstring)."""

    def __init__(
        self,
        store: ArtifactStore,
        run_id: str,
        run_dir: Path,
        on_stored: Callable[[str, StoredObject | None, str, dict], None],
        on_problem: Callable[[str], None] | None = None,
        poll_s: float = 1.0,
    ):
        self.store, self.run_id, self.run_dir = store, run_id, run_dir.resolve()
        self.on_stored, self.on_problem, self.poll_s = on_stored, on_problem or (lambda m: None), poll_s
        self._queue: queue.Queue[tuple[str, str, dict] | None] = queue.Queue()
        self._uploaded: dict[str, tuple[tuple[int, int, int], StoredObject]] = {}  # key -> (stat signature, object)
        self._stop = threading.Event()
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._loop, name=f"uploader-{run_id}", daemon=True)
        self._thread.start()

    def key(self, path: str | Path) -> str:
        p = Path(path).resolve()
        rel = p.relative_to(self.run_dir).as_posix() if self.run_dir in p.parents else f"files/{p.name}"
        return run_key(self.run_id, rel)

    def mark_present(self, path: Path) -> None:
        """A file just fetched from the store: it is there already, no need to upload it again."""
        if path.is_file():
            key = self.key(path)
            size, digest = file_sha256(path)
            self._uploaded[key] = (_signature(path), StoredObject(key, self.store.uri(key), size, digest))

    def submit(self, kind: str, path: str, meta: dict) -> None:
        self._queue.put((kind, path, meta))

    def close(self, timeout: float = 3600.0) -> None:
        """Upload everything submitted, and the checkpoints once more, then stop."""
        self._queue.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.error("uploads of run %s still running after %.0fs; giving up waiting", self.run_id, timeout)

    # -- the thread -------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=self.poll_s)
            except queue.Empty:
                self._watch_checkpoints()
                continue
            if item is None:
                self._watch_checkpoints()
                return
            kind, path, meta = item
            obj, error = self._upload(Path(path), overwrite=kind not in EXPORT_KINDS)
            if error:
                meta = {**meta, "upload_error": error}
            try:
                self.on_stored(kind, obj, path, meta)
            except Exception as e:  # noqa: BLE001 - never kill the thread
                log.error("could not hand over artifact %s: %s", path, e)

    def _watch_checkpoints(self) -> None:
        for name in CHECKPOINTS:
            p = self.run_dir / "checkpoints" / name
            if p.is_file():
                self._upload(p)

    def _upload(self, path: Path, overwrite: bool = True) -> tuple[StoredObject | None, str | None]:
        if not path.is_file():
            return None, f"{path.name} is missing"
        try:
            key = self.key(path)
        except BadKey as e:
            return None, str(e)
        sig = _signature(path)
        done = self._uploaded.get(key)
        if done is not None and done[0] == sig:
            return done[1], None  # unchanged since its last upload
        delay, error = 0.5, ""
        for attempt in range(1, UPLOAD_ATTEMPTS + 1):
            try:
                obj = self.store.put_file(path, key, overwrite=overwrite)
            except FileNotFoundError:  # replaced between stat and open: the watcher sees the new one
                return None, f"{path.name} vanished while uploading"
            except KeyExists as e:  # another file already stands behind this key: it is kept, not replaced
                obj = _stored_copy(self.store, key, path) if attempt > 1 else None
                if obj is None:
                    error = str(e)
                    break
            except Exception as e:  # noqa: BLE001 - retried, then reported on the run
                error = f"{e.__class__.__name__}: {e}"
                log.warning("upload of %s to %s failed (attempt %d): %s", key, self.store.url, attempt, error)
                time.sleep(delay)
                delay *= 4
                continue
            self._uploaded[key] = (sig, obj)
            return obj, None
        message = f"could not upload {key} to the artifact store {self.store.url}: {error}"
        if message not in self.errors:
            self.errors.append(message)
            self.on_problem(message)
        return None, message


def _stored_copy(store: ArtifactStore, key: str, path: Path) -> StoredObject | None:
    """After a retry: the object under key when it holds exactly this file's bytes (an earlier attempt that
    reported an error had stored it after all), else None."""
    h, n = hashlib.sha256(), 0
    try:
        size, digest = file_sha256(path)
        with store.open(key) as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
                n += len(chunk)
    except Exception as e:  # noqa: BLE001 - unknown, so not ours: the upload is reported as refused
        log.warning("could not compare %s in %s with %s: %s", key, store.url, path, e)
        return None
    return StoredObject(key, store.uri(key), size, digest) if (n, h.hexdigest()) == (size, digest) else None


def _signature(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return st.st_ino, st.st_size, st.st_mtime_ns


def fetch_checkpoints(store: ArtifactStore, run_id: str, run_dir: Path) -> list[Path]:
    """Before a resume: bring the run's checkpoints from the store when this host lacks them or holds
    older copies (the run went on elsewhere). Returns the files fetched."""
    fetched = []
    for name in CHECKPOINTS:
        key, local = run_key(run_id, f"checkpoints/{name}"), run_dir / "checkpoints" / name
        try:
            if not store.exists(key):
                continue
            if local.is_file() and not _newer(store, key, local):
                continue
            store.get_file(key, local)
            fetched.append(local)
        except Exception as e:  # noqa: BLE001 - a resume from an older local copy beats no run at all
            log.warning("could not fetch %s from %s: %s", key, store.url, e)
    return fetched


def _newer(store: ArtifactStore, key: str, local: Path) -> bool:
    stamp = store.modified(key)
    return stamp is not None and stamp > local.stat().st_mtime + 1


def localize_dataset(spec: Any, store: ArtifactStore, engine: Any = None, cache: Path | None = None) -> Any:
    """An imagefolder spec whose data.path (or data.test_path) is missing on this host but whose uploaded dataset
    is in the store: fetch `datasets/<name>.zip` (cached) and return the spec reading from it. Else the spec as is."""
    data = spec.data
    if data.name != "imagefolder":
        return spec
    update = {f: local for f in ("path", "test_path") if (local := _localized(getattr(data, f), store, engine, cache))}
    return spec.model_copy(update={"data": data.model_copy(update=update)}) if update else spec


def _localized(path: str | None, store: ArtifactStore, engine: Any, cache: Path | None) -> str | None:
    """The local copy of the uploaded dataset registered at `path`, when this host lacks `path`; else None."""
    if not path or Path(path).expanduser().exists():
        return None
    name = _dataset_name(path, engine)
    if name is None:
        return None
    key = dataset_key(name)
    try:
        if not store.exists(key):
            return None
        from db.engine import data_home

        local = (cache or data_home() / "datasets" / ".store") / f"{name}.zip"
        if not (local.is_file() and local.stat().st_size == store.size(key)):
            store.get_file(key, local)
    except BadKey:
        return None
    log.info("dataset %s fetched from %s to %s", name, store.url, local)
    return str(local)


def _dataset_name(path: str, engine: Any) -> str | None:
    if engine is not None:
        from db.repo import list_datasets

        try:
            for d in list_datasets(engine):
                if d.uri == path:
                    return Path(d.uri).name  # the store key names the upload's folder (app.services.datasets.store_key)
        except Exception as e:  # noqa: BLE001 - fall back to the folder's name
            log.warning("could not list datasets: %s", e)
    name = Path(path).name
    return name if name and name not in (".", "..") and "/" not in name else None
