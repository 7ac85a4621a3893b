#!/usr/bin/env bash
# Set up (or check) everything `make run` / `make test` need, idempotently:
#   scripts/setup.sh EXTRAS      e.g. "local" (the main job) or "dev,local,ray,postgres,train,clients" (the tests)
# 1. a virtual environment in .venv (Python 3.11+);
# 2. the project installed editable with EXTRAS, llama.cpp built with portable flags; skipped when
#    pyproject.toml and EXTRAS are unchanged since the last install (a stamp file in .venv);
# 3. the system packages the product uses, installed with apt-get when missing and possible,
#    otherwise named with the command that installs them.
set -euo pipefail
cd "$(dirname "$0")/.."
extras=${1:?usage: scripts/setup.sh EXTRAS}
venv=.venv

say() { printf 'setup: %s\n' "$*" >&2; }

# --- 1. the virtual environment ------------------------------------------------------------
if [ ! -x "$venv/bin/python" ]; then
  py=${PYTHON:-python3}
  command -v "$py" >/dev/null || { say "no $py on PATH: install Python 3.11 or newer"; exit 1; }
  "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || { say "$("$py" --version) is too old: Python 3.11 or newer is needed (set PYTHON=...)"; exit 1; }
  say "creating $venv with $("$py" --version)"
  "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
fi

# --- 2. the project and its Python dependencies ----------------------------------------------
# A native llama.cpp build segfaulted in decode on some of our CPUs; this portable AVX2 build does
# not. pip caches the built wheel, so only the very first install compiles it (~5 min).
export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AVX_VNNI=OFF}"
want=$( (cat pyproject.toml; echo "extras=$extras"; echo "cmake=$CMAKE_ARGS") | sha256sum | cut -c1-16)
stamp="$venv/.installed-${extras//,/-}"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  say "installing the project with [$extras] (the first time compiles llama.cpp: ~5 min)"
  "$venv/bin/python" -m pip install --quiet -e ".[$extras]"
  echo "$want" > "$stamp"
fi

# --- 3. system packages -----------------------------------------------------------------------
# command:debian-package:why
needs=(
  "bwrap:bubblewrap:runtimes run in bubblewrap sandboxes (or pass --sandbox none to the launcher)"
)
# the viewer's browser tests drive the system Chromium (tests only: the product does not need it)
if [[ ",$extras," == *,dev,* ]]; then
  needs+=("chromium:chromium:the viewer's browser tests run in headless Chromium")
  # the claude-code and codex harness tests install their pinned CLIs with npm into the harness
  # install cache (once per machine, at the first test run); mini-swe-agent gets a venv there
  needs+=("node:nodejs:the codex harness runs on Node.js")
  needs+=("npm:npm:the claude-code and codex harnesses are installed with npm")
  # tasks in container images (docs/images.md): build, copy and unpack images; the tests' base image
  needs+=("buildah:buildah:the image tests build task images with buildah")
  needs+=("skopeo:skopeo:the image tests copy images out of the local container store")
  needs+=("umoci:umoci:the image tests unpack images")
  needs+=("mmdebstrap:mmdebstrap:the image tests build their base image from Debian packages")
fi
# the store tests run on SQLite and on a throwaway PostgreSQL server (Debian keeps pg_ctl off PATH)
if [[ ",$extras," == *,postgres,* ]]; then
  needs+=("pg_ctl:postgresql:the store tests start a PostgreSQL server (the PostgreSQL half is skipped without it)")
fi
has() {
  command -v "$1" >/dev/null && return 0
  [ "$1" = pg_ctl ] && compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" >/dev/null
}
missing=()
for n in "${needs[@]}"; do
  IFS=: read -r cmd pkg _ <<<"$n"
  has "$cmd" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing system packages: ${missing[*]}"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"; } >&2 \
      || say "apt-get could not install ${missing[*]}"
  fi
  for n in "${needs[@]}"; do
    IFS=: read -r cmd pkg why <<<"$n"
    has "$cmd" \
      || say "MISSING: $cmd ($why). Install it with: sudo apt-get install $pkg"
  done
fi
