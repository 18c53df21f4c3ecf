#!/usr/bin/env bash
# The base image of the shipped tasks, made locally (no image registry is
# reachable here): Debian bookworm, minbase plus python3, from the Debian
# mirror apt already uses, imported into podman as forgelog-base:bookworm.
# Idempotent: does nothing when the image exists. About 2 minutes cold.
set -euo pipefail
IMAGE=localhost/forgelog-base:bookworm
if podman image exists "$IMAGE"; then
  echo "base-image: $IMAGE ready" >&2
  exit 0
fi
mirror=$( (grep -rhoE 'https?://deb\.debian\.org/debian' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null || true) | head -n 1)
mirror=${mirror:-http://deb.debian.org/debian}
root=$(mktemp -d -t forgelog-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
echo "base-image: debootstrap bookworm from $mirror (once per machine, ~2 min)" >&2
debootstrap --variant=minbase --include=python3 bookworm "$root" "$mirror" >/dev/null
tar -C "$root" -c . | podman import -q --change 'CMD ["/bin/bash"]' - "$IMAGE" >/dev/null
echo "base-image: $IMAGE ready" >&2
