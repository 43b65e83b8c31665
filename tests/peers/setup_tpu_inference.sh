#!/usr/bin/env bash
# Build the environment the kit's attention cases run tpu-inference's kernel in: tpu-inference
# 0.32.0 (vLLM's TPU backend) with the JAX it pins (0.11.2, Python >= 3.12) and libtpu for the
# compile-only v6e devices, in a venv of its own.
#
#   bash tests/peers/setup_tpu_inference.sh            # -> .venvs/tpu-inference (~1 GB)
#   VENV=DIR PY=python3.12 bash tests/peers/setup_tpu_inference.sh
#
# Then: .venv/bin/python -m pytest -m tpu_inference tests/peers (README "Peers").
# tpu-inference itself goes in with --no-deps: its dependencies are vLLM's serving stack
# (torch, vLLM, cloud storage); the kernels need only JAX, which examples/tpu_inference_adapter.py
# loads without the package's __init__.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
VENV="${VENV:-$HERE/../../.venvs/tpu-inference}"
PY="${PY:-$(command -v python3.12 || command -v python3)}"
"$PY" -c 'import sys; assert sys.version_info[:2] >= (3, 12), f"jax 0.11.2 needs Python >= 3.12, not {sys.version}"'

rm -rf "$VENV"
"$PY" -m venv "$VENV"
PIP=("$VENV/bin/pip" install --no-input --disable-pip-version-check -q)
"${PIP[@]}" jax==0.11.2 jaxlib==0.11.2 libtpu==0.0.48 numpy
"${PIP[@]}" --no-deps tpu-inference==0.32.0
"$VENV/bin/python" -c '
import sys; sys.path.insert(0, "'"$HERE"'/../../examples")
from tpu_inference_adapter import load_kernels; load_kernels()
print("tpu-inference 0.32.0 peer environment ready")'
