#!/usr/bin/env bash
# A base image equivalent to python:3.11-slim-bookworm, made from Debian's archive alone, for a host
# that reaches Debian's mirrors but no image registry:
#
#   scripts/debian-base.sh [TAG]        # default torchdeck/debian-python:bookworm
#
# debootstrap (minbase: the required packages, with python3, its venv module and the CA certificates)
# into a temporary folder, then `docker import`. Prints the tag. Needs root, debootstrap and a Docker
# engine; MIRROR overrides the mirror (default: the first deb.debian.org-like URI in apt's sources).
set -euo pipefail
tag="${1:-torchdeck/debian-python:bookworm}"
mirror="${MIRROR:-$(grep -rhoE 'https?://[^ ]+/debian/?' /etc/apt/sources.list /etc/apt/sources.list.d 2>/dev/null | grep -v security | head -n1)}"
mirror="${mirror:-http://deb.debian.org/debian}"
command -v debootstrap >/dev/null || { echo "debian-base: debootstrap is missing (apt-get install -y debootstrap)" >&2; exit 1; }
root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
echo "debian-base: debootstrap bookworm from $mirror" >&2
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$root" "$mirror" >&2
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" -c . | docker import \
  -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  -c 'ENV LANG=C.UTF-8' \
  -c 'CMD ["bash"]' \
  - "$tag" >/dev/null
docker run --rm "$tag" python3 -c 'import ssl, venv, sys; print("debian-base: python", sys.version.split()[0])' >&2
echo "$tag"
