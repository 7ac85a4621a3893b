#!/usr/bin/env bash
# Builds the stand-in base image the image tests use, from Debian packages only (no Docker Hub):
# a Debian rootfs with python3, python3-pytest, bash and coreutils made by mmdebstrap, imported into
# the local container store (shared by buildah, skopeo, podman) as localhost/rollout-test/python:3.
# Needs: mmdebstrap, buildah (apt-get install mmdebstrap buildah). Usage:
#   scripts/build_base_images.sh [REF]     (default REF: localhost/rollout-test/python:3)
# Idempotent: an image already in the store is kept (remove it with `buildah rmi REF` to rebuild).
set -euo pipefail
ref="${1:-localhost/rollout-test/python:3}"
suite="${ROLLOUT_BASE_SUITE:-bookworm}"
if buildah inspect --type image "$ref" >/dev/null 2>&1; then
    echo "$ref is already in the local container store"
    exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mmdebstrap --variant=minbase --include=python3,python3-pytest,bash,coreutils \
    --format=tar "$suite" "$work/rootfs.tar"
ctr="$(buildah from scratch)"
trap 'buildah rm "$ctr" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
buildah add "$ctr" "$work/rootfs.tar" /
buildah config --workingdir / --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd /bin/bash "$ctr"
buildah commit --quiet "$ctr" "$ref"
echo "built $ref"
