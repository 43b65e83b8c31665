"""A config that leaves fields out means what transformers means: each family's config cut to
the fields that fix parameter shapes (tests/fixtures/minimal, made by
tools/make_minimal_configs.py) must give the layer kinds and windows transformers resolved and
its logits (to 1e-4 relative), with the family fixture's weights."""

import json
import shutil

import numpy as np
import pytest
from helpers import FIXTURES, TOLERANCE

import swajax
from swajax.api.generation import teacher_forced_logits
from swajax.config import LayerKind, parse_hf_config

MINIMAL = FIXTURES / "minimal"
FAMILIES = sorted(p.name for p in MINIMAL.iterdir())
KINDS = {
    "sliding_attention": LayerKind.SLIDING,
    "full_attention": LayerKind.FULL,
    "chunked_attention": LayerKind.CHUNKED,
}


@pytest.mark.parametrize("family", FAMILIES)
def test_omitted_fields_mean_what_transformers_means(family, tmp_path):
    cfg = json.loads((MINIMAL / family / "config.json").read_text())
    resolved = json.loads((MINIMAL / family / "resolved.json").read_text())
    layers = parse_hf_config(cfg).layers
    if resolved["layer_types"] is not None:
        assert [la.kind for la in layers] == [KINDS[t] for t in resolved["layer_types"]]
    for la in layers:
        if la.kind is LayerKind.SLIDING:
            assert la.window == resolved["sliding_window"] - 1  # W counts keys before the query
        if la.kind is LayerKind.CHUNKED:
            assert la.window == resolved["attention_chunk_size"]
    folder = tmp_path / family
    folder.mkdir()
    shutil.copy(MINIMAL / family / "config.json", folder / "config.json")
    for f in (FIXTURES / family).glob("*.safetensors"):
        shutil.copy(f, folder / f.name)
    prompt = json.loads((FIXTURES / family / "greedy.json").read_text())["prompt"]
    llm = swajax.LLM(str(folder), max_model_len=64, kv_budget_gib=0.05)
    logits = teacher_forced_logits(llm.engine, prompt)
    expected = np.load(MINIMAL / family / "logits.npy")
    err = float(np.max(np.abs(logits - expected)) / np.max(np.abs(expected)))
    assert err <= TOLERANCE["float32"], f"{family}: relative logit error {err:.2e}"
