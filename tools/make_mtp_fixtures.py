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

DeepSeek-V4 (`deepseek_v4_mtp`): transformers skips its `mtp.*` tensors and has no MTP forward
for it, so the reference is assembled here from transformers' own V4 modules in the shape of
DeepSeek's reference `MTPBlock` (the checkpoint's `inference/model.py`): the token's embedding,
`enorm` then `e_proj`, added to each of the target's last-layer streams (before its
hyper-connection head), `hnorm` then `h_proj`; one `DeepseekV4DecoderLayer` (window-only
attention, top-k routed MoE: the layer number after the decoder's); the block's own
`DeepseekV4HyperHead` and `norm`; the target's head. The block's decoder layer is layer N of a
model one layer deeper, written by transformers' `save_pretrained` (the hub's names) and read
back by it; the names go under `mtp.0.` with the KV norm as the hub names it (`attn.kv_norm`).
`mtp_logits.npy` is [79, vocab] over the base fixture's 80-token prompt.
"""

from __future__ import annotations

import copy
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from make_fixtures import LONG_PROMPT, OUT, PROMPT, build, reload  # noqa: E402 - beside this script
from safetensors.torch import load_file, save_file
from transformers.masking_utils import create_sliding_window_causal_mask
from transformers.modeling_layers import MtpModel
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as v4

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


def _v4_block(main, n: int):
    """(transformers' decoder layer N of a model one layer deeper, its tensors under the hub's
    `mtp.0.` names)."""
    deeper = copy.deepcopy(main.config)
    deeper.num_hidden_layers = n + 1
    deeper.layer_types = [*main.config.layer_types, "sliding_attention"]
    deeper.mlp_layer_types = [*main.config.mlp_layer_types, "moe"]
    with tempfile.TemporaryDirectory() as tmp:
        build(deeper, seed=11).save_pretrained(tmp)
        stored = load_file(Path(tmp) / "model.safetensors")
        block = reload(Path(tmp)).model.layers[n]
    layer = f"model.layers.{n}."
    tensors = {}
    for name, t in stored.items():
        if name.startswith(layer):
            rest = name[len(layer) :].replace("attn.norm.weight", "attn.kv_norm.weight")
            tensors[f"mtp.0.{rest}"] = t
    return block, tensors


def make_v4(name: str) -> None:
    src, out = OUT / "deepseek_v4", OUT / name
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(src, out)
    main = reload(out)
    cfg = main.config
    n, h, hc = cfg.num_hidden_layers, cfg.hidden_size, cfg.hc_mult
    block, tensors = _v4_block(main, n)
    gen = torch.Generator().manual_seed(12)
    own = {  # the block's parts beside its decoder layer, drawn like the base weights
        "enorm.weight": (h,),
        "hnorm.weight": (h,),
        "norm.weight": (h,),
        "e_proj.weight": (h, h),
        "h_proj.weight": (h, h),
        "hc_head_fn": (hc, hc * h),
        "hc_head_base": (hc,),
        "hc_head_scale": (1,),
    }
    for part, shape in own.items():
        tensors[f"mtp.0.{part}"] = torch.randn(shape, generator=gen) * 0.3
    weights = load_file(out / "model.safetensors")
    save_file({**weights, **tensors}, out / "model.safetensors")

    def norm(part):
        m = v4.DeepseekV4RMSNorm(h, eps=cfg.rms_norm_eps)
        m.weight.data.copy_(tensors[f"mtp.0.{part}.weight"])
        return m

    head = v4.DeepseekV4HyperHead(cfg)
    for part in ("fn", "base", "scale"):
        getattr(head, f"hc_{part}").data.copy_(tensors[f"mtp.0.hc_head_{part}"])
    main = reload(out)  # the target as transformers reads the folder back (it skips mtp.*)
    ids = torch.tensor([LONG_PROMPT])
    seen = {}
    hook = main.model.layers[-1].register_forward_hook(lambda m, a, out: seen.setdefault("x", out))
    with torch.no_grad():
        main(input_ids=ids)
        hook.remove()
        streams, follow = seen["x"][:, :-1], ids[:, 1:]
        pos = torch.arange(follow.shape[1])[None]
        e = norm("enorm")(main.model.embed_tokens(follow))
        x = torch.nn.functional.linear(e, tensors["mtp.0.e_proj.weight"]).unsqueeze(2)
        x = x + torch.nn.functional.linear(norm("hnorm")(streams), tensors["mtp.0.h_proj.weight"])
        rope = {
            k: main.model.rotary_emb(e, position_ids=pos, layer_type=k)
            for k in ("main", "compress")
        }
        mask = create_sliding_window_causal_mask(
            config=main.config, inputs_embeds=e, attention_mask=None, cache=None, position_ids=pos
        )
        x = block(
            x, position_embeddings=rope, position_ids=pos, attention_mask=mask, input_ids=follow
        )
        logits = main.lm_head(norm("norm")(head(x)))[0].float().numpy()
    np.save(out / "mtp_logits.npy", logits)
    (out / "greedy.json").unlink(missing_ok=True)
    (out / "logits.npy").unlink(missing_ok=True)
    (out / "prompt.json").write_text(json.dumps(LONG_PROMPT) + "\n")
    print(f"{name}: {len(tensors)} draft tensors, mtp_logits {logits.shape}")


def make(name: str) -> None:
    if name == "deepseek_v4_mtp":
        return make_v4(name)
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
    for name in sys.argv[1:] or [*MTP, "deepseek_v4_mtp"]:
        make(name)
