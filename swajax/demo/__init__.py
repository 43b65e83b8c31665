"""The embedded default model: a 1.3M-parameter hybrid byte-level LM (MiMo-V2-Flash family:
sliding and full layers, SWA sinks) trained by tools/train_demo.py on Python's standard library,
shipped here as a Hugging Face checkpoint (bfloat16 weights) and loaded like any other."""

from __future__ import annotations

from pathlib import Path

DEMO_DIR = Path(__file__).resolve().parent


def demo_decoder(dtype: str = "auto", mesh=None):
    from swajax.models import load_decoder

    return load_decoder(DEMO_DIR, dtype=dtype, mesh=mesh)
