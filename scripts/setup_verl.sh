#!/usr/bin/env bash
# A second virtual environment, .venv-verl, for verl's agent loop (docs/training.md, "verl"):
# verl 0.9.1 needs transformers >= 5.5.3, < 5.11 (the `train` extra's venv has a newer one), so it
# gets its own: verl==0.9.1, a transformers it accepts, torch's CPU build, and this project without the
# train extra (what rollout.train.adapters and rollout.train.verl_loop import), plus pytest and
# cachetools (verl 0.9.1 imports it without declaring it).
#   scripts/setup_verl.sh            then   .venv-verl/bin/python -m pytest tests/train/test_verl_loop.py
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-verl
py=${PYTHON:-python3}
say() { printf 'setup_verl: %s\n' "$*" >&2; }

if [ ! -x "$venv/bin/python" ]; then
  say "creating $venv with $("$py" --version)"
  "$py" -m venv "$venv"
fi
# torch's CPU build (a plain torch pulls a multi-GB CUDA build): pinned in a constraints file so
# verl's dependencies cannot swap it
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
printf 'torch==2.13.0+cpu\n' > "$constraints"
"$venv/bin/python" -m pip install --quiet -c "$constraints" torch==2.13.0+cpu
"$venv/bin/python" -m pip install --quiet -c "$constraints" "verl==0.9.1" -e . pytest pytest-asyncio cachetools
say "ready: $("$venv/bin/python" -c 'import verl, transformers, torch; print("verl", verl.__version__, "transformers", transformers.__version__, "torch", torch.__version__)')"
