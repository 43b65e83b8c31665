"""Build the multi-token-prediction (MTP) fixtures: a base fixture plus its draft layer in the
hub's layout, and transformers' own MTP forward over it (tests/fixtures/*_mtp).

Run in the fixture environment (see tools/make_fixtures.py), after the base fixtures exist:

    .hfenv/bin/python tools/make_mtp_fixtures.py

transformers implements the draft layers once for every family (`MtpModel`: the token's
embedding and the target's hidden state, each normed, joined and projected, then one decoder
layer of the family, its own final norm and the target's head). Each fixture's MTP layer is that
module over the family's decoder layer, drawn from N(0, 0.3^2) like the base weights, and
written under the names the hub's checkpoints use:

- Step 3.x: `model.layers.{N}.*` (numbered after the decoder, `num_nextn_predict_layers`),
  the block's tensors beside `enorm`, `hnorm`, `eh_proj` and `shared_head.norm`; reloaded through
  transformers' own `MtpModel.from_pretrained`, which must find every tensor.
- MiMo-V2-Flash: `model.mtp.layers.{i}.*`, the block's post-attention norm named
  `pre_mlp_layernorm`, the final one `final_layernorm` and the sinks `attention_sink_bias`
  (transformers' loader has no rule for these names, so the weights are put into the module
  here, by that mapping).

Recorded: `mtp_logits.npy` [23, vocab], the draft's logits at positions 0..22 of the base
fixtures' 24-token prompt, where position i reads the target's final hidden state at i (after
its final norm, as transformers hands it over) and the prompt's token i + 1.
"""

from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import torch
from make_fixtures import OUT, PROMPT, reload  # noqa: E402 - beside this script
from safetensors.torch import load_file, save_file
from transformers.modeling_layers import MtpModel

# fixture -> (base fixture, the MTP layer's attention kind, its MLP kind)
MTP = {
    "step3p7_mtp": ("step3p7", "sliding_attention", "dense"),
    "mimo_v2_flash_mtp": ("mimo_v2_flash", "sliding_attention", "dense"),
}


def _text(cfg):
    return getattr(cfg, "text_config", None) or cfg


def _draft(main, attention: str, mlp: str) -> MtpModel:
    text = _text(main.config)
    text.num_nextn_predict_layers = 1
    if not hasattr(type(text), "attribute_map") or "num_mtp_layers" not in text.attribute_map:
        text.num_mtp_layers = 1
    text.mtp_layer_types, text.mtp_mlp_layer_types = [attention], [mlp]
    torch.manual_seed(7)
    mtp = MtpModel(main, 1).eval()
    gen = torch.Generator().manual_seed(8)
    with torch.no_grad():
        for name, p in mtp.named_parameters():
            if name.startswith("layers."):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return mtp


def _hub_names(base: str, mtp: MtpModel, n: int) -> dict[str, torch.Tensor]:
    """The draft layer's tensors under the names the family's hub checkpoints use."""
    out = {}
    for name, t in mtp.state_dict().items():
        if not name.startswith("layers.0."):
            continue  # the shared embedding and head stay the target's
        rest = name[len("layers.0.") :]
        if base == "step3p7":
            rest = rest.replace("post_norm.", "shared_head.norm.").removeprefix("mtp_block.")
            out[f"model.layers.{n}.{rest}"] = t
        else:
            rest = rest.replace("post_norm.", "final_layernorm.").removeprefix("mtp_block.")
            rest = rest.replace("post_attention_layernorm.", "pre_mlp_layernorm.")
            rest = rest.replace("self_attn.sinks", "self_attn.attention_sink_bias")
            out[f"model.mtp.layers.0.{rest}"] = t
    return out


def _mimo_reload(mtp: MtpModel, tensors: dict[str, torch.Tensor]) -> None:
    """Put the hub-named MiMo tensors back into the module, by the mapping above reversed."""
    state = {}
    for name, t in tensors.items():
        rest = name.removeprefix("model.mtp.layers.0.")
        if rest.split(".")[0] in ("enorm", "hnorm", "eh_proj"):
            state[f"layers.0.{rest}"] = t
        elif rest.startswith("final_layernorm."):
            state[f"layers.0.{rest.replace('final_layernorm.', 'post_norm.')}"] = t
        else:
            rest = rest.replace("pre_mlp_layernorm.", "post_attention_layernorm.")
            rest = rest.replace("self_attn.attention_sink_bias", "self_attn.sinks")
            state[f"layers.0.mtp_block.{rest}"] = t
    missing, unexpected = mtp.load_state_dict(state, strict=False)
    layer = [m for m in missing if m.startswith("layers.")]
    if layer or unexpected:
        raise SystemExit(f"MiMo MTP mapping: missing {layer}, unexpected {unexpected}")


def make(name: str) -> None:
    base, attention, mlp = MTP[name]
    src, out = OUT / base, OUT / name
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(src, out)
    main = reload(out)
    n = _text(main.config).num_hidden_layers
    mtp = _draft(main, attention, mlp)
    tensors = _hub_names(base, mtp, n)
    weights = load_file(out / "model.safetensors")
    save_file(
        {**weights, **{k: v.contiguous() for k, v in tensors.items()}}, out / "model.safetensors"
    )
    cfg = json.loads((out / "config.json").read_text())
    text = cfg.get("text_config", cfg)
    text["num_nextn_predict_layers"] = 1
    text["mtp_layer_types"], text["mtp_mlp_layer_types"] = [attention], [mlp]
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")

    main = reload(out)  # the target as transformers reads the folder back
    if base == "step3p7":
        draft = MtpModel.from_pretrained(main)  # raises if a draft tensor is missing
    else:
        draft = _draft(main, attention, mlp)
        _mimo_reload(draft, tensors)
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        result = main(input_ids=ids, output_hidden_states=True)
        hidden = result.hidden_states[-1]
        pos = torch.arange(len(PROMPT) - 1)[None]
        x = draft.forward_layer(0, hidden[:, :-1], pos, None, input_ids=ids[:, 1:])
        logits = draft._project_to_logits(x)[0].float().numpy()
    np.save(out / "mtp_logits.npy", logits)
    (out / "greedy.json").unlink(missing_ok=True)  # the base fixture's: not this folder's oracle
    (out / "logits.npy").unlink(missing_ok=True)
    print(f"{name}: {len(tensors)} draft tensors, mtp_logits {logits.shape}")


if __name__ == "__main__":
    for name in sys.argv[1:] or MTP:
        make(name)
