"""A real S3 endpoint for tests: moto's server (HTTP, in a thread of the test process) on a free port.

    with moto_s3_server() as s3:
        s3.create_bucket("artifacts")
        env = s3.env()        # AWS_* credentials + TORCHDECK_S3_ENDPOINT_URL, for subprocesses too
        url = s3.url("artifacts", "torchdeck")   # s3://artifacts/torchdeck

Every process (the test, spawned run processes, Celery workers, a Streamlit server) reaches it over
HTTP like any S3-compatible service; moto keeps the objects in memory until the server stops.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from tests._servers import free_port

ACCESS_KEY = "torchdeck-test"
SECRET_KEY = "torchdeck-test-secret"
REGION = "us-east-1"


@dataclass
class MotoS3:
    endpoint_url: str
    server: object = field(repr=False)

    def env(self) -> dict[str, str]:
        """The variables a torchdeck process needs to use this endpoint (db.artifacts reads them)."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_REGION": REGION,
            "TORCHDECK_S3_ENDPOINT_URL": self.endpoint_url,
        }

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
        )

    def create_bucket(self, name: str | None = None) -> str:
        name = name or f"td-{secrets.token_hex(6)}"
        self.client().create_bucket(Bucket=name)
        return name

    def url(self, bucket: str, prefix: str = "") -> str:
        return f"s3://{bucket}" + (f"/{prefix}" if prefix else "")

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


@contextmanager
def moto_s3_server() -> Iterator[MotoS3]:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request otherwise
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield MotoS3(f"http://127.0.0.1:{port}", server)
    finally:
        server.stop()
