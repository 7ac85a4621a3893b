#!/usr/bin/env bash
# Builds a stand-in base image from Debian packages only (no Docker Hub): a Debian rootfs made by
# mmdebstrap, imported into the local container store (shared by buildah, skopeo, podman).
#   scripts/build_base_images.sh [REF]         python3, python3-pytest, bash, coreutils
#                                              (default REF: localhost/rollout-test/python:3)
#   scripts/build_base_images.sh --pip [REF]   that, plus what a python:3.N-slim Dockerfile uses:
#                                              `python` and `pip` (installing system-wide, as in
#                                              those images), venv, ca-certificates
#                                              (default REF: localhost/rollout-test/python:3-pip)
# ROLLOUT_BASE_PACKAGES="a,b" adds Debian packages; ROLLOUT_BASE_SUITE picks the suite (bookworm).
# Needs: mmdebstrap, buildah (apt-get install mmdebstrap buildah).
# Idempotent: an image already in the store is kept (remove it with `buildah rmi REF` to rebuild).
set -euo pipefail
pip=""
if [ "${1:-}" = "--pip" ]; then
    pip=1
    shift
fi
ref="${1:-localhost/rollout-test/python:3${pip:+-pip}}"
suite="${ROLLOUT_BASE_SUITE:-bookworm}"
packages="python3,python3-pytest,bash,coreutils"
if [ -n "$pip" ]; then
    packages="$packages,python3-pip,python3-venv,python-is-python3,ca-certificates"
fi
if [ -n "${ROLLOUT_BASE_PACKAGES:-}" ]; then
    packages="$packages,$ROLLOUT_BASE_PACKAGES"
fi
if buildah inspect --type image "$ref" >/dev/null 2>&1; then
    echo "$ref is already in the local container store"
    exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# with --pip: no "externally managed" marker, so `pip install` installs system-wide as it does in
# a python:3.N-slim image (into /usr/local)
hooks=()
if [ -n "$pip" ]; then
    hooks=(--customize-hook='rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED')
fi
mmdebstrap --variant=minbase --include="$packages" "${hooks[@]}" --format=tar "$suite" "$work/rootfs.tar"
ctr="$(buildah from scratch)"
trap 'buildah rm "$ctr" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
buildah add "$ctr" "$work/rootfs.tar" /
buildah config --workingdir / --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd /bin/bash "$ctr"
buildah commit --quiet "$ctr" "$ref"
echo "built $ref"
