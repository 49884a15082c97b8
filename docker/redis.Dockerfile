# Redis from Debian's packages, for a host that reaches no image registry (scripts/compose-check.sh
# builds it when `redis:7` cannot be pulled; TORCHDECK_REDIS_IMAGE in .env selects it). docker-compose.yml
# gives its command (`redis-server --appendonly yes --requirepass ...`); its data lives in /data, as in
# the public image.
#
#   docker build -f docker/redis.Dockerfile --build-arg BASE_IMAGE=torchdeck/debian-python:bookworm \
#     -t torchdeck-redis:7 docker
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}

ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends redis-server \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /data \
 && chown redis:redis /data
WORKDIR /data
USER redis
EXPOSE 6379
CMD ["redis-server", "--protected-mode", "no"]
