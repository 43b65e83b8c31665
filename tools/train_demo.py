"""Train the embedded demo model: a tiny hybrid byte-level LM on Python's own standard library.

    pip install -e '.[train]'
    python tools/train_demo.py --minutes 25  # writes swajax/demo/{config.json,model.safetensors}
    python tools/train_demo.py --mtp --minutes 10  # then adds its multi-token-prediction layer

The model is a MiMo-V2-Flash-family checkpoint (that family has dense layers, per-kind
attention shapes and SWA sinks): 6 layers S S F S S F, hidden 128, 4 query heads of 32, 2 KV
heads, window 64 bytes on the sliding layers with a learned sink per head, vocabulary = the 256
byte values. It is written in the Hugging Face layout and read back by `swajax` like any other
checkpoint, so the forward below is a second, dense implementation of the same architecture
(causal masks instead of pools): the perplexity test in tests/models/test_demo.py runs the
shipped weights through the engine and would fail if the two disagreed.

`--mtp` trains a multi-token-prediction layer on the shipped model (frozen), as MiMo-V2-Flash
publishes one: from the target's hidden state at position i and the token at i + 1 it predicts
the token at i + 2 (`mtp_forward`), and it is written beside the decoder as `model.mtp.layers.0.*`
(config `num_nextn_predict_layers: 1`): the draft `draft_model="mtp"` runs (swajax.models.mtp).

Data: every top-level `*.py` file of the running interpreter's standard library (PSF licence),
in sorted order, except the held-out files in HELD_OUT; sequences of 256 bytes drawn uniformly.
"""

from __future__ import annotations

import argparse
import json
import sysconfig
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from swajax.models.rope import RopeSpec, apply_rope

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "swajax" / "demo"
HELD_OUT = ("textwrap.py", "fnmatch.py")  # tests/fixtures/demo_heldout.py is cut from these
KINDS = "SSFSSF"
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, WIDTH, WINDOW, SEQ = 128, 4, 2, 32, 384, 64, 256
EPS = 1e-5

CONFIG = {
    "architectures": ["MiMoV2FlashForCausalLM"],
    "model_type": "mimo_v2_flash",
    "vocab_size": 256,
    "hidden_size": HIDDEN,
    "intermediate_size": WIDTH,
    "num_hidden_layers": len(KINDS),
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "head_dim": HEAD_DIM,
    "v_head_dim": HEAD_DIM,
    "swa_num_attention_heads": HEADS,
    "swa_num_key_value_heads": KV_HEADS,
    "swa_head_dim": HEAD_DIM,
    "swa_v_head_dim": HEAD_DIM,
    "sliding_window_size": WINDOW,
    "layer_types": ["sliding_attention" if c == "S" else "full_attention" for c in KINDS],
    "mlp_layer_types": ["dense"] * len(KINDS),
    "add_swa_attention_sink_bias": True,
    "add_full_attention_sink_bias": False,
    "attention_value_scale": 1.0,
    "attention_bias": False,
    "rms_norm_eps": EPS,
    "rope_parameters": {
        kind: {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0}
        for kind in ("sliding_attention", "full_attention")
    },
    "tie_word_embeddings": False,
    "max_position_embeddings": 4096,
    "bos_token_id": 10,
    "eos_token_id": 0,  # NUL never occurs in source text: generation stops at max tokens
    "pad_token_id": 0,
    "torch_dtype": "bfloat16",
}
ROPE = RopeSpec(theta=10000.0, dim=HEAD_DIM)


def corpus(stdlib: Path) -> bytes:
    files = sorted(p for p in stdlib.glob("*.py") if p.name not in HELD_OUT)
    return b"\n".join(p.read_bytes() for p in files)


def init(key) -> dict:
    def normal(key, shape, std):
        return std * jax.random.normal(key, shape, jnp.float32)

    keys = iter(jax.random.split(key, 8 * len(KINDS) + 2))
    layers = []
    for c in KINDS:
        layer = {
            "q": normal(next(keys), (HIDDEN, HEADS * HEAD_DIM), HIDDEN**-0.5),
            "k": normal(next(keys), (HIDDEN, KV_HEADS * HEAD_DIM), HIDDEN**-0.5),
            "v": normal(next(keys), (HIDDEN, KV_HEADS * HEAD_DIM), HIDDEN**-0.5),
            "o": normal(next(keys), (HEADS * HEAD_DIM, HIDDEN), (2 * HIDDEN * len(KINDS)) ** -0.5),
            "gate": normal(next(keys), (HIDDEN, WIDTH), HIDDEN**-0.5),
            "up": normal(next(keys), (HIDDEN, WIDTH), HIDDEN**-0.5),
            "down": normal(next(keys), (WIDTH, HIDDEN), (2 * WIDTH * len(KINDS)) ** -0.5),
            "ln1": jnp.ones(HIDDEN),
            "ln2": jnp.ones(HIDDEN),
        }
        if c == "S":
            layer["sinks"] = jnp.zeros(HEADS)
        layers.append(layer)
    return {
        "embed": normal(next(keys), (256, HIDDEN), 1.0),
        "layers": layers,
        "norm": jnp.ones(HIDDEN),
        "head": normal(next(keys), (HIDDEN, 256), HIDDEN**-0.5),
    }


def rms(x, w):
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + EPS) * w


def attend(p, x, kind, positions):
    b, t, _ = x.shape
    q = (x @ p["q"]).reshape(b, t, HEADS, HEAD_DIM)
    k = (x @ p["k"]).reshape(b, t, KV_HEADS, HEAD_DIM)
    v = (x @ p["v"]).reshape(b, t, KV_HEADS, HEAD_DIM)
    q = jax.vmap(lambda a: apply_rope(a, positions, ROPE))(q)
    k = jax.vmap(lambda a: apply_rope(a, positions, ROPE))(k)
    k, v = jnp.repeat(k, HEADS // KV_HEADS, 2), jnp.repeat(v, HEADS // KV_HEADS, 2)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) * HEAD_DIM**-0.5
    qi, ki = positions[:, None], positions[None, :]
    mask = ki <= qi
    if kind == "S":  # the query and the W tokens before it
        mask &= ki >= qi - WINDOW
    s = jnp.where(mask, s, -jnp.inf)
    if kind == "S":  # a sink joins the denominator only
        sink = jnp.broadcast_to(p["sinks"][None, :, None, None], (b, HEADS, t, 1))
        probs = jax.nn.softmax(jnp.concatenate([s, sink], -1), -1)[..., :-1]
    else:
        probs = jax.nn.softmax(s, -1)
    out = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, t, HEADS * HEAD_DIM)
    return out @ p["o"]


def block(p, x, kind, positions):
    x = x + attend(p, rms(x, p["ln1"]), kind, positions)
    h = rms(x, p["ln2"])
    return x + (jax.nn.silu(h @ p["gate"]) * (h @ p["up"])) @ p["down"]


def hidden(params, tokens):
    """The final norm's output: what the head reads, and what a multi-token-prediction layer
    reads of the target."""
    positions = jnp.arange(tokens.shape[1], dtype=jnp.int32)
    x = params["embed"][tokens]
    for p, kind in zip(params["layers"], KINDS):
        x = block(p, x, kind, positions)
    return rms(x, params["norm"])


def forward(params, tokens):
    return hidden(params, tokens) @ params["head"]


def loss_fn(params, batch):
    logits = forward(params, batch[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()


def init_mtp(key) -> dict:
    """A multi-token-prediction layer (the MiMo-V2-Flash layout): norms of the next token's
    embedding and of the target's hidden state, joined and projected, one sliding layer, its
    final norm; the target's head."""
    k1, k2 = jax.random.split(key)
    layer = init(k1)["layers"][0]  # a sliding layer's shapes, freshly drawn
    eh = jax.random.normal(k2, (2 * HIDDEN, HIDDEN), jnp.float32) * (2 * HIDDEN) ** -0.5
    return {
        "enorm": jnp.ones(HIDDEN),
        "hnorm": jnp.ones(HIDDEN),
        "eh": eh,
        "block": layer,
        "final": jnp.ones(HIDDEN),
    }


def mtp_forward(mtp, target, tokens):
    """Logits for token i + 2 at each position i < T - 2 of `tokens` [B, T], from the target's
    hidden state at i and token i + 1."""
    h = jax.lax.stop_gradient(hidden(target, tokens[:, :-2]))
    e = target["embed"][tokens[:, 1:-1]]
    x = jnp.concatenate([rms(e, mtp["enorm"]), rms(h, mtp["hnorm"])], -1) @ mtp["eh"]
    x = block(mtp["block"], x, "S", jnp.arange(x.shape[1], dtype=jnp.int32))
    return rms(x, mtp["final"]) @ target["head"]


def hf_tensors(params) -> dict[str, np.ndarray]:
    """The Hugging Face layout: nn.Linear weights are [out, in]."""
    out = {
        "model.embed_tokens.weight": params["embed"],
        "model.norm.weight": params["norm"],
        "lm_head.weight": params["head"].T,
    }
    names = {
        "q": "self_attn.q_proj",
        "k": "self_attn.k_proj",
        "v": "self_attn.v_proj",
        "o": "self_attn.o_proj",
        "gate": "mlp.gate_proj",
        "up": "mlp.up_proj",
        "down": "mlp.down_proj",
    }
    for i, p in enumerate(params["layers"]):
        pre = f"model.layers.{i}"
        for key, name in names.items():
            out[f"{pre}.{name}.weight"] = p[key].T
        out[f"{pre}.input_layernorm.weight"] = p["ln1"]
        out[f"{pre}.post_attention_layernorm.weight"] = p["ln2"]
        if "sinks" in p:
            out[f"{pre}.self_attn.attention_sink_bias"] = p["sinks"]
    return {k: np.asarray(v, np.float32) for k, v in out.items()}


def mtp_tensors(mtp) -> dict[str, np.ndarray]:
    """The MTP layer under MiMo-V2-Flash's hub names (`model.mtp.layers.0.*`)."""
    pre = "model.mtp.layers.0"
    layer = hf_tensors({"embed": 0, "norm": 0, "head": jnp.zeros(1), "layers": [mtp["block"]]})
    out = {}
    for name, value in layer.items():
        if name.startswith("model.layers.0."):
            rest = name[len("model.layers.0.") :]
            rest = rest.replace("post_attention_layernorm", "pre_mlp_layernorm")
            out[f"{pre}.{rest}"] = value
    out[f"{pre}.enorm.weight"] = np.asarray(mtp["enorm"], np.float32)
    out[f"{pre}.hnorm.weight"] = np.asarray(mtp["hnorm"], np.float32)
    out[f"{pre}.eh_proj.weight"] = np.asarray(mtp["eh"].T, np.float32)
    out[f"{pre}.final_layernorm.weight"] = np.asarray(mtp["final"], np.float32)
    return out


def from_hf(tensors: dict) -> dict:
    """The target's parameters back from its Hugging Face tensors (as float32)."""
    t = {k: jnp.asarray(np.asarray(v, np.float32)) for k, v in tensors.items()}
    layers = []
    for i, kind in enumerate(KINDS):
        pre = f"model.layers.{i}"
        layer = {
            "q": t[f"{pre}.self_attn.q_proj.weight"].T,
            "k": t[f"{pre}.self_attn.k_proj.weight"].T,
            "v": t[f"{pre}.self_attn.v_proj.weight"].T,
            "o": t[f"{pre}.self_attn.o_proj.weight"].T,
            "gate": t[f"{pre}.mlp.gate_proj.weight"].T,
            "up": t[f"{pre}.mlp.up_proj.weight"].T,
            "down": t[f"{pre}.mlp.down_proj.weight"].T,
            "ln1": t[f"{pre}.input_layernorm.weight"],
            "ln2": t[f"{pre}.post_attention_layernorm.weight"],
        }
        if kind == "S":
            layer["sinks"] = t[f"{pre}.self_attn.attention_sink_bias"]
        layers.append(layer)
    return {
        "embed": t["model.embed_tokens.weight"],
        "layers": layers,
        "norm": t["model.norm.weight"],
        "head": t["lm_head.weight"].T,
    }


def save(params, folder: Path) -> None:
    import ml_dtypes
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.astype(ml_dtypes.bfloat16) for k, v in hf_tensors(params).items()}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n")


def train(loss, params, batches, minutes: float, lr: float):
    """AdamW under a wall-clock budget: a long constant phase after warm-up, then the last 20%
    of the budget decays linearly (the step count is unknown up front)."""
    opt = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.inject_hyperparams(optax.adamw)(learning_rate=lr, weight_decay=0.01),
    )
    state = opt.init(params)

    @jax.jit
    def step(params, state, batch, lr):
        state[1].hyperparams["learning_rate"] = lr
        value, grads = jax.value_and_grad(loss)(params, batch)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    start, budget, n, smooth = time.time(), minutes * 60, 0, None
    while (elapsed := time.time() - start) < budget:
        frac = elapsed / budget
        rate = lr * min(1.0, (n + 1) / 100) * min(1.0, (1 - frac) / 0.2)
        params, state, value = step(params, state, next(batches), jnp.float32(rate))
        n += 1
        smooth = float(value) if smooth is None else 0.98 * smooth + 0.02 * float(value)
        if n % 50 == 0:
            print(f"step {n}  {elapsed / 60:5.1f} min  loss {smooth:.3f} nats/byte", flush=True)
    print(f"done: {n} steps, final loss {smooth:.3f}")
    return params


def add_mtp(args, data, rng) -> None:
    """Train the demo's MTP layer on the shipped target (frozen) and add it to the folder."""
    import ml_dtypes
    from safetensors.numpy import load_file, save_file

    weights = load_file(str(args.out / "model.safetensors"))
    target = from_hf({k: v for k, v in weights.items() if not k.startswith("model.mtp.")})

    def loss(mtp, batch):
        logits = mtp_forward(mtp, target, batch)
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 2:]).mean()

    mtp = train(
        loss,
        init_mtp(jax.random.PRNGKey(args.seed + 1)),
        batches(data, rng, args.batch),
        args.minutes,
        args.lr,
    )
    tensors = {k: v for k, v in weights.items() if not k.startswith("model.mtp.")}
    tensors.update({k: v.astype(ml_dtypes.bfloat16) for k, v in mtp_tensors(mtp).items()})
    save_file(tensors, str(args.out / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((args.out / "config.json").read_text())
    cfg["num_nextn_predict_layers"] = 1
    (args.out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    print(f"added an MTP layer to {args.out}")


def batches(data, rng, size: int):
    while True:
        starts = rng.integers(0, len(data) - SEQ - 1, size)
        yield jnp.asarray(np.stack([data[s : s + SEQ + 1] for s in starts]), jnp.int32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=25.0, help="wall-clock training budget")
    ap.add_argument(
        "--mtp",
        action="store_true",
        help="train only a multi-token-prediction layer on the shipped model and add it",
    )
    ap.add_argument("--batch", type=int, default=24)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()

    data = np.frombuffer(corpus(Path(sysconfig.get_paths()["stdlib"])), np.uint8)
    print(f"corpus: {len(data):,} bytes")
    rng = np.random.default_rng(args.seed)
    if args.mtp:
        add_mtp(args, data, rng)
        return
    params = train(
        loss_fn,
        init(jax.random.PRNGKey(args.seed)),
        batches(data, rng, args.batch),
        args.minutes,
        args.lr,
    )
    save(params, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
