# The dashboard (`app`) and the one-shot schema migration (`migrate`): slim Python, no torch.
# The app never imports torch (it validates specs with core.config, reads the database and
# enqueues runs by task name), so its image stays small and starts fast.
#
#   docker build -f docker/app.Dockerfile -t torchdeck-app .
#
# BASE_IMAGE: any Debian-like image with Python 3.11 and its venv module (default the public
# python:3.11-slim-bookworm; scripts/debian-base.sh makes an equivalent from Debian's archive where no
# image registry is reachable). WHEELS: a folder URL of wheels to install from instead of an index
# (scripts/compose-check.sh serves one on loopback: `docker build --network host`).
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}
ARG WHEELS=

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    TORCHDECK_HOME=/var/lib/torchdeck \
    TORCHDECK_ARTIFACTS=/data/artifacts

RUN python3 -m venv /opt/venv

# One unprivileged user, the same uid in the worker image: both write the `artifacts` volume,
# which Docker initialises from /data/artifacts (and its owner) in the first image that mounts it.
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /var/lib/torchdeck torchdeck \
 && mkdir -p /data/artifacts \
 && chown torchdeck:torchdeck /data/artifacts

WORKDIR /opt/torchdeck
COPY pyproject.toml README.md ./
COPY core ./core
COPY db ./db
COPY worker ./worker
COPY app ./app
COPY configs ./configs
# The base install: no torch (torch, torchvision and the export libraries are the [worker] extra).
# The check makes a dependency change that would pull torch in fail the build, not bloat it.
RUN pip install ${WHEELS:+--no-index --find-links "$WHEELS"} . \
 && if python -c "import torch" 2>/dev/null; then \
      echo "torch got installed into the app image: keep it in the [worker] extra of pyproject.toml" >&2; exit 1; \
    fi \
 && torchdeck --help >/dev/null

USER torchdeck
EXPOSE 8501
# `docker-compose.yml` gives the command of each service; this default is the dashboard.
CMD ["torchdeck", "ui", "--port", "8501"]
