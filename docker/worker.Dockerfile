# syntax=docker/dockerfile:1
# Workers (`worker-gpu`, `worker-cpu`): CUDA base image, torch 2.14.1 + torchvision 0.29.1 (a
# pair: other pairings fail to import), one solo-pool Celery worker per GPU.
#
#   docker build -f docker/worker.Dockerfile -t torchdeck-worker .
#
# The torch wheels carry their own CUDA runtime, cuDNN and NCCL; the host needs only an NVIDIA
# driver new enough for CUDA 13.0 and the NVIDIA Container Toolkit. Another CUDA line: override
# both build arguments, e.g. --build-arg CUDA_IMAGE=nvidia/cuda:12.8.1-base-ubuntu24.04
# --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-base-ubuntu24.04
FROM ${CUDA_IMAGE}

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130
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

# python3-dev and gcc: torch.compile (spec key `compile`) builds small C launchers at run time.
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc libc6-dev ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv

# torch first, from the index of its CUDA line: the biggest layer, cached across code changes.
RUN pip install --index-url ${TORCH_INDEX_URL} torch==2.14.1 torchvision==0.29.1

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
RUN pip install ".[worker]" \
 && python -c "import torch, torchvision; assert torch.__version__.startswith('2.14.1'), torch.__version__" \
 && torchdeck --help >/dev/null

USER torchdeck
# Pretrained weights offline: mount them at $TORCH_HOME/hub/checkpoints (README, "Train from a YAML file").
# docker-compose.yml gives the command (`torchdeck worker --gpus 0 --queues gpu` or `--queues cpu`).
CMD ["torchdeck", "worker", "--queues", "cpu"]
