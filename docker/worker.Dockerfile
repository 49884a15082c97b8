# Workers (`worker-gpu`, `worker-cpu`): torch 2.14.1 + torchvision 0.29.1 (a pair: other pairings
# fail to import), one solo-pool Celery worker per GPU.
#
#   docker build -f docker/worker.Dockerfile -t torchdeck-worker .
#
# No CUDA base image: the torch wheels carry their own CUDA runtime, cuDNN and NCCL; the host needs
# only an NVIDIA driver new enough for CUDA 13.0 and the NVIDIA Container Toolkit, which mounts the
# driver into the container. Another CUDA line: --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
#
# BASE_IMAGE: any Debian-like image with Python 3.11 and its venv module (default the public
# python:3.11-slim-bookworm; scripts/debian-base.sh makes an equivalent from Debian's archive where no
# image registry is reachable). WHEELS: a folder URL of wheels to install everything from instead of
# the indexes (scripts/compose-check.sh serves one on loopback: `docker build --network host`).
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130
ARG WHEELS=
ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    TORCHDECK_HOME=/var/lib/torchdeck \
    TORCHDECK_ARTIFACTS=/data/artifacts \
    TORCH_HOME=/var/lib/torchdeck/torch \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

# gcc and Python's headers: torch.compile (spec key `compile`) builds small C launchers at run time
# (the public python image has the headers; Debian's python3 needs python3-dev).
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev ca-certificates \
 && if [ ! -e "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h" ]; then \
      apt-get install -y --no-install-recommends python3-dev; \
    fi \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv

# torch first, from the index of its CUDA line: the biggest layer, cached across code changes.
RUN if [ -n "$WHEELS" ]; then \
      pip install --no-index --find-links "$WHEELS" torch==2.14.1 torchvision==0.29.1; \
    else \
      pip install --index-url "$TORCH_INDEX_URL" torch==2.14.1 torchvision==0.29.1; \
    fi

# Same uid as the app image: both write the shared `artifacts` volume.
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /var/lib/torchdeck torchdeck \
 && mkdir -p /data/artifacts /var/lib/torchdeck/torch/hub/checkpoints \
 && chown -R torchdeck:torchdeck /data/artifacts /var/lib/torchdeck

WORKDIR /opt/torchdeck
COPY pyproject.toml README.md ./
COPY core ./core
COPY db ./db
COPY worker ./worker
COPY app ./app
COPY configs ./configs
# The worker extra: torch (already satisfied above), torchvision, the export libraries.
RUN pip install ${WHEELS:+--no-index --find-links "$WHEELS"} ".[worker]" \
 && python -c "import torch, torchvision; assert torch.__version__.startswith('2.14.1'), torch.__version__" \
 && torchdeck --help >/dev/null

USER torchdeck
# Pretrained weights offline: mount them at $TORCH_HOME/hub/checkpoints (README, "Train from a YAML file").
# docker-compose.yml gives the command (`torchdeck worker --gpus 0 --queues gpu` or `--queues cpu`).
CMD ["torchdeck", "worker", "--queues", "cpu"]
