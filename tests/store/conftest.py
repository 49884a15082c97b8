"""Fixtures of the artifact store tests, importable by other suites:

    from tests.store.conftest import moto_s3, s3_artifacts  # noqa: F401 (in a conftest.py)

- `moto_s3` (session): a running moto S3 server (tests.store.s3.MotoS3: endpoint_url, env(),
  create_bucket(), keys(), client()).
- `s3_artifacts` (function): a fresh bucket, and this process's environment pointing
  TORCHDECK_ARTIFACTS (s3://<bucket>/torchdeck), the AWS variables and TORCHDECK_S3_ENDPOINT_URL at it;
  returns an S3Artifacts (url, bucket, env, s3).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.store.s3 import MotoS3, moto_s3_server


@dataclass
class S3Artifacts:
    url: str
    bucket: str
    prefix: str
    env: dict[str, str]
    s3: MotoS3

    def keys(self, under: str = "") -> list[str]:
        """Object keys relative to the store's prefix."""
        base = f"{self.prefix}/"
        return [k[len(base) :] for k in self.s3.keys(self.bucket, base + under)]


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3]:
    with moto_s3_server() as s3:
        yield s3


@pytest.fixture
def s3_artifacts(moto_s3: MotoS3, monkeypatch: pytest.MonkeyPatch) -> S3Artifacts:
    bucket = moto_s3.create_bucket()
    url = moto_s3.url(bucket, "torchdeck")
    env = {**moto_s3.env(), "TORCHDECK_ARTIFACTS": url}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return S3Artifacts(url=url, bucket=bucket, prefix="torchdeck", env=env, s3=moto_s3)
