"""Build tests/fixtures/minimal/: each family's config with every field transformers defaults
left out, and what transformers makes of it (the oracle of `swajax/config/hf_defaults.py`).

Run in the fixture environment (tools/make_fixtures.py says how to make it), after the
fixtures themselves:

    .hfenv/bin/python tools/make_minimal_configs.py

For each family: the fixture's config.json cut down to the fields that fix parameter shapes
(`KEEP`, plus the family's own in `SHAPES`), loaded by transformers with the fixture's weights;
stored are the cut config (`config.json`), transformers' float32 logits of the fixtures' prompt
(`logits.npy`) and the layer kinds and window it resolved (`resolved.json`). The weights are not
copied: the test reads them from the fixture.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_fixtures import OUT, PROMPT, auto_class  # noqa: E402

KEEP = {
    "model_type",
    "architectures",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "tie_word_embeddings",
    "dtype",
}
SHAPES = {
    "gpt_oss": {"num_local_experts", "num_experts_per_tok"},
    "llama4": {
        "intermediate_size_mlp",
        "num_local_experts",
        "num_experts_per_tok",
        "interleave_moe_layer_step",
    },
    "mimo_v2_flash": {
        "v_head_dim",
        "swa_head_dim",
        "swa_v_head_dim",
        "swa_num_attention_heads",
        "swa_num_key_value_heads",
        "n_routed_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "moe_layer_freq",
        "hybrid_layer_pattern",
        "layer_types",
        "mlp_layer_types",
    },
    # Gemma 4's shapes depend on each layer's type (its own head dims and KV heads).
    "gemma4": {
        "per_layer_config",
        "attention_k_eq_v",
        "enable_moe_block",
        "num_experts",
        "top_k_experts",
        "moe_intermediate_size",
        "num_kv_shared_layers",
        "use_double_wide_mlp",
        "hidden_size_per_layer_input",
        "vocab_size_per_layer_input",
        "layer_types",
    },
}
SHAPES["gemma4_e"] = SHAPES["gemma4"]
FAMILIES = [
    "qwen3",
    "qwen2",
    "mistral",
    "gpt_oss",
    "gemma3",
    "gemma3_legacy",
    "olmo3",
    "exaone4",
    "cohere2",
    "llama4",
    "mimo_v2_flash",
    "gemma4",
    "gemma4_e",
]


def main() -> None:
    for name in FAMILIES:
        base = OUT / name
        cfg = json.loads((base / "config.json").read_text())
        keep = KEEP | SHAPES.get(name, set())
        minimal = {k: v for k, v in cfg.items() if k in keep}
        out = OUT / "minimal" / name
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(minimal, indent=2) + "\n")
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            shutil.copy(out / "config.json", folder / "config.json")
            for f in base.glob("*.safetensors"):
                shutil.copy(f, folder / f.name)
            model = auto_class(minimal["model_type"]).from_pretrained(
                folder, dtype=torch.float32, attn_implementation="eager"
            )
            # transformers 5.24's Gemma 4 runs KV-shared layers only with hidden states asked for
            extra = {"output_hidden_states": True} if name.startswith("gemma4") else {}
            with torch.no_grad():
                ids = torch.tensor([PROMPT])
                logits = model.eval()(input_ids=ids, **extra).logits[0].numpy()
        np.save(out / "logits.npy", logits.astype(np.float32))
        c = model.config
        resolved = dict(
            layer_types=getattr(c, "layer_types", None),
            sliding_window=getattr(c, "sliding_window", None),
            attention_chunk_size=getattr(c, "attention_chunk_size", None),
        )
        (out / "resolved.json").write_text(json.dumps(resolved) + "\n")
        print(name, sorted(set(cfg) - keep))


if __name__ == "__main__":
    main()
