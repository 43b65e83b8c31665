"""Load folders written by `swajax convert --to hf` with transformers and compare their logits
with the fixtures' (transformers' reading of the original checkpoints).

Run in the fixture environment (tools/make_fixtures.py says how to make it), after exporting
(into any folder; `exported/` here, ignored by git; delete it afterwards):

    for f in tests/fixtures/*/; do
        swajax convert "$f" "exported/$(basename "$f")" --to hf --force
    done
    .hfenv/bin/python tools/check_hf_export.py exported/*

Exit status 1 if any folder's logits differ from its fixture's by more than 1e-4 (absolute).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
import transformers as tf

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
TOLERANCE = 1e-4


def logits_of(folder: Path, prompt: list[int]) -> np.ndarray:
    cfg = json.loads((folder / "config.json").read_text())
    auto = tf.AutoModelForCausalLM
    if cfg.get("architectures", [""])[0].endswith("ForConditionalGeneration"):
        auto = tf.AutoModelForImageTextToText
    model = auto.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([prompt])).logits[0].float().numpy()


def main(folders: list[str]) -> int:
    worst = 0.0
    for folder in map(Path, folders):
        fixture = FIXTURES / folder.name
        prompt = json.loads((fixture / "greedy.json").read_text())["prompt"]
        diff = float(np.max(np.abs(logits_of(folder, prompt) - np.load(fixture / "logits.npy"))))
        worst = max(worst, diff)
        print(f"{folder.name:20s} max |logits - fixture| = {diff:.2e}")
    print(f"worst {worst:.2e} (tolerance {TOLERANCE})")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
