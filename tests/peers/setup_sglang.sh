#!/usr/bin/env bash
# Build the environment the SGLang differential tests replay in: SGLang 0.5.23 on CPU, in a
# venv of its own (it pins torch and ~60 packages that must not meet swajax's JAX stack).
#
#   bash tests/peers/setup_sglang.sh            # -> .venvs/sglang (about 6 GB, 2-4 minutes)
#   VENV=DIR bash tests/peers/setup_sglang.sh
#
# Then: .venv/bin/python -m pytest -m sglang tests/peers   (README "SGLang as the oracle").
# Every package is pinned and installed with --no-deps, so pip resolves nothing and never
# pulls a second torch; torch comes from the machine's configured index (a local disk here).
# The CUDA build of torch is what SGLang 0.5.23's wheel expects; it imports and runs on CPU,
# but needs its nvidia-* libraries present to import.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
VENV="${VENV:-$HERE/../../.venvs/sglang}"
PY="${PY:-$(command -v python3.11 || command -v python3)}"
"$PY" -c 'import sys; assert sys.version_info[:2] == (3, 11), f"SGLang 0.5.23 wheel: cp311, not {sys.version}"'

rm -rf "$VENV"
"$PY" -m venv "$VENV"
PIP=("$VENV/bin/pip" install --no-deps --no-input --disable-pip-version-check -q)
"${PIP[@]}" torch==2.14.1 torchvision==0.29.1
"${PIP[@]}" -r "$HERE/sglang-requirements.txt"

# The three modules the adapter drives, and the Rust tree core the wheel bundles.
"$VENV/bin/python" -W ignore -c '
import logging; logging.disable(logging.WARNING)
import sglang.srt.mem_cache.allocator.swa, sglang.srt.mem_cache.unified_radix_cache
import sglang.srt.mem_cache.rust_tree_core.mem_cache
print("SGLang 0.5.23 peer environment ready")'
