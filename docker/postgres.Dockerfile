# Postgres from Debian's packages, for a host that reaches no image registry (scripts/compose-check.sh
# builds it when `postgres:16` cannot be pulled; TORCHDECK_POSTGRES_IMAGE in .env selects it). It reads
# the environment of the public image that docker-compose.yml sets (POSTGRES_USER, POSTGRES_PASSWORD,
# POSTGRES_DB), keeps its data in the same folder, and answers `pg_isready`.
#
#   docker build -f docker/postgres.Dockerfile --build-arg BASE_IMAGE=torchdeck/debian-python:bookworm \
#     -t torchdeck-postgres:15 docker
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}

ENV DEBIAN_FRONTEND=noninteractive \
    PGDATA=/var/lib/postgresql/data \
    PATH=/usr/lib/postgresql/15/bin:$PATH
RUN apt-get update \
 && apt-get install -y --no-install-recommends postgresql-15 \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p "$PGDATA" /var/run/postgresql \
 && chown -R postgres:postgres /var/lib/postgresql /var/run/postgresql \
 && chmod 700 "$PGDATA"
COPY postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint.sh
USER postgres
EXPOSE 5432
STOPSIGNAL SIGINT
ENTRYPOINT ["/usr/local/bin/postgres-entrypoint.sh"]
