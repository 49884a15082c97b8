"""An S3-compatible bucket as the artifact store (AWS, MinIO, Ceph, moto), through fsspec/s3fs."""

from __future__ import annotations

import os
import re
import threading
from typing import BinaryIO
from urllib.parse import urlparse

from db.artifacts.base import (
    CHUNK,
    ENDPOINT_ENV,
    ArtifactStore,
    BadKey,
    KeyExists,
    StoreCheck,
    StoreError,
    check_key,
    copy_hashing,
)

_FS_CACHE: dict[tuple, object] = {}
_FS_LOCK = threading.Lock()


class S3Store(ArtifactStore):
    """An S3-compatible bucket through s3fs (AWS, MinIO, Ceph, moto)."""

    def __init__(self, url: str):
        parsed = urlparse(url)
        if not parsed.netloc:
            raise StoreError(f"artifact store URL {url!r}: name a bucket (s3://bucket/prefix)")
        self.bucket = parsed.netloc
        self.prefix = parsed.path.strip("/")
        if self.prefix:
            check_key(self.prefix)
        self.url = f"s3://{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")
        self.endpoint_url = os.environ.get(ENDPOINT_ENV) or None
        self._fs = None

    @property
    def fs(self):
        if self._fs is None:
            self._fs = self._make_fs(attempts=4)
        return self._fs

    def _make_fs(self, attempts: int):
        """One client per configuration and process (making one costs ~0.5 s); the configuration comes
        from the environment each time, so changed credentials or endpoint give a new client."""
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        creds = tuple(
            os.environ.get(k)
            for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE")
        )
        token = (os.getpid(), self.endpoint_url, region, creds, attempts)
        with _FS_LOCK:
            fs = _FS_CACHE.get(token)
            if fs is None:
                fs = _FS_CACHE[token] = self._new_fs(attempts, region)
        return fs

    def _new_fs(self, attempts: int, region: str):
        try:
            import s3fs
        except ImportError as e:  # pragma: no cover - s3fs is a dependency
            raise StoreError("s3:// artifact stores need the s3fs package (pip install s3fs)") from e
        kwargs: dict = {
            "use_listings_cache": False,
            "skip_instance_cache": True,
            "client_kwargs": {"region_name": region},
            "config_kwargs": {
                "retries": {"max_attempts": attempts, "mode": "standard"},
                "connect_timeout": 10,
                "read_timeout": 120,
            },
        }
        if self.endpoint_url:
            kwargs["endpoint_url"] = self.endpoint_url
        key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
        if key and secret:
            kwargs.update(key=key, secret=secret, token=os.environ.get("AWS_SESSION_TOKEN") or None)
        fs = s3fs.S3FileSystem(**kwargs)
        fs.retries = attempts  # s3fs's own retry loop (on top of botocore's)
        return fs

    def check(self) -> StoreCheck:
        """As ArtifactStore.check, without retrying: a doctor answers quickly."""
        fs, self._fs = self._fs, self._make_fs(attempts=1)
        try:
            return super().check()
        finally:
            self._fs = fs

    def _path(self, key: str, *, prefix: bool = False) -> str:
        k = check_key(key, prefix=prefix)
        return "/".join(filter(None, (self.bucket, self.prefix, k)))

    def _write_stream(self, src: BinaryIO, key: str, overwrite: bool = True) -> tuple[int, str]:
        # An S3 object appears whole when its (multipart) upload completes: readers never see half a file.
        # overwrite=False: refused up front when the key exists, and the upload itself is conditional
        # (If-None-Match: *, mode "xb"), so a writer racing another never replaces its object either.
        if not overwrite and self.exists(key):
            raise KeyExists(self.url, key)
        out = self.fs.open(self._path(key), "wb" if overwrite else "xb")
        try:
            result = copy_hashing(src, out)
        except BaseException:
            discard = getattr(out, "discard", None)  # abort the multipart upload: nothing is stored
            if discard is not None:
                discard()
                out.closed = True  # discarded: closing it later (even by the garbage collector) must not upload
            raise
        try:
            out.close()
        except FileExistsError:
            raise KeyExists(self.url, key) from None
        return result

    def open(self, key: str) -> BinaryIO:
        return self.fs.open(self._path(key), "rb", block_size=CHUNK)

    def exists(self, key: str) -> bool:
        return bool(self.fs.isfile(self._path(key)))

    def size(self, key: str) -> int:
        return int(self.fs.info(self._path(key))["size"])

    def modified(self, key: str) -> float | None:
        stamp = self.fs.info(self._path(key)).get("LastModified")
        return stamp.timestamp() if hasattr(stamp, "timestamp") else None

    def delete(self, key: str) -> bool:
        p = self._path(key)
        if not self.fs.isfile(p):
            return False
        self.fs.rm_file(p)
        return True

    def delete_prefix(self, prefix: str) -> int:
        base = self._path(prefix, prefix=True)
        found = self.fs.find(base + "/")
        if self.fs.isfile(base):
            found.append(base)
        if found:
            self.fs.rm(found)
        return len(found)

    def list(self, prefix: str = "") -> list[str]:
        base = self._path(prefix, prefix=True) if prefix else "/".join(filter(None, (self.bucket, self.prefix)))
        start = len("/".join(filter(None, (self.bucket, self.prefix)))) + 1
        return sorted(p[start:] for p in self.fs.find(base + "/"))

    def uri(self, key: str) -> str:
        return "s3://" + self._path(key)

    def key_of(self, uri: str) -> str | None:
        base = self.url + "/"
        if not uri.startswith(base):
            return None
        try:
            return check_key(uri[len(base) :])
        except BadKey:
            return None

    def _fix(self, e: Exception) -> str:
        text = f"{e.__class__.__name__} {e}"
        if "NoSuchBucket" in text or "does not exist" in text.lower():
            return f"create the bucket {self.bucket!r} (or fix the bucket name in TORCHDECK_ARTIFACTS)"
        if "EndpointConnectionError" in text or "Could not connect" in text:  # its URL may hold any digits
            return self._unreachable()
        if any(
            s in text for s in ("AccessDenied", "Forbidden", "InvalidAccessKeyId", "SignatureDoesNotMatch")
        ) or re.search(r"\b403\b", text):
            return "give AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY of a user allowed to read and write the bucket"
        if "NoCredentials" in text or "Unable to locate credentials" in text:
            return "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)"
        return self._unreachable()

    def _unreachable(self) -> str:
        return (
            f"check that the S3 endpoint ({self.endpoint_url or 'AWS'}) is reachable from this host "
            f"({ENDPOINT_ENV} for MinIO or another S3-compatible service) and the credentials are right"
        )
