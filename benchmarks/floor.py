"""The engine against its model's floor: the same weights run as a bare jitted decode loop.

    python benchmarks/floor.py [--json] [--batches 1,16,64] [--prompt-len 16] [--new 128]
        [--repeats 3] [--wide] [--smoke]

The floor is written here from the checkpoint's config.json alone (MiMo-V2-Flash's layout, the
demo's family): a dense static KV cache [batch, context, kv heads, head dim] per layer, no
pages, no allocator, no prefix cache; one jitted prefill, then one jitted step per token with
the cache donated and greedy sampling on device; tokens are read once, at the end. Beside
each multi-step setting of the engine, the floor runs that many steps per program too (a
`fori_loop` over the same step), the strongest form of it. The engine
runs the same prompts through `swajax.api.generate` (hybrid pools, one exchange per step, or per
round of up to `--decode-steps` steps). Everything is compiled before timing and run
interleaved, best of `--repeats`; the greedy tokens must be identical (all in float32). Prints
tokens / s for each and engine / floor.

`--wide`: a randomly initialised model of the same family, wider and deeper (hidden 512, 8
layers), where the model's own arithmetic weighs more than per-step overhead.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "swajax" / "demo"
F32 = jnp.float32


def weights_of(decoder) -> dict:
    """The decoder's parameters as plain arrays, named as the floor reads them."""
    layers = []
    for layer in decoder.layers:
        a, m = layer.self_attn, layer.mlp
        layers.append(
            dict(
                ln1=layer.input_layernorm.weight[...],
                ln2=layer.post_attention_layernorm.weight[...],
                q=a.q_proj.kernel[...],
                k=a.k_proj.kernel[...],
                v=a.v_proj.kernel[...],
                o=a.o_proj.kernel[...],
                sinks=None if a.sinks is None else a.sinks[...],
                gate=m.gate_proj.kernel[...],
                up=m.up_proj.kernel[...],
                down=m.down_proj.kernel[...],
            )
        )
    return dict(
        embed=decoder.embed[...],
        norm=decoder.norm.weight[...],
        layers=layers,
        head=decoder.lm_head.weight[...].T,
    )


class Floor:
    """MiMo-V2-Flash (dense MLPs) from its config.json: per-type heads, sinks on sliding
    layers, window = `sliding_window_size` tokens before the query, rotate-half RoPE."""

    def __init__(self, config: dict, batch: int, context: int):
        c = config
        self.eps, self.b, self.t = c["rms_norm_eps"], batch, context
        self.window = c["sliding_window_size"]
        self.local = [kind == "sliding_attention" for kind in c["layer_types"]]
        self.shape = {
            True: (
                c["swa_num_attention_heads"],
                c["swa_num_key_value_heads"],
                c["swa_head_dim"],
                c["swa_v_head_dim"],
            ),
            False: (
                c["num_attention_heads"],
                c["num_key_value_heads"],
                c["head_dim"],
                c["v_head_dim"],
            ),
        }
        rope = c["rope_parameters"]
        self.theta = {
            True: rope["sliding_attention"]["rope_theta"],
            False: rope["full_attention"]["rope_theta"],
        }

    def cache(self):
        return [
            (jnp.zeros((self.b, self.t, kv, d), F32), jnp.zeros((self.b, self.t, kv, dv), F32))
            for local in self.local
            for _, kv, d, dv in [self.shape[local]]
        ]

    def _norm(self, x, w):
        return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + self.eps) * w

    def _rope(self, x, pos, theta):  # x [b, s, h, d], pos [b, s]
        d = x.shape[-1]
        inv = 1.0 / theta ** (jnp.arange(0, d, 2, dtype=F32) / d)
        ang = pos[..., None].astype(F32) * inv
        cos, sin = jnp.cos(ang)[:, :, None], jnp.sin(ang)[:, :, None]
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

    def forward(self, w, cache, tokens, pos):
        """tokens, pos [b, s] (s new tokens at positions pos); logits of the last [b, V]."""
        hi = jax.lax.Precision.HIGHEST
        x = w["embed"][tokens]
        keys = jnp.arange(self.t)
        out = []
        for lw, local, (k_cache, v_cache) in zip(w["layers"], self.local, cache):
            heads, kv, d, dv = self.shape[local]
            h = self._norm(x, lw["ln1"])
            b, s = tokens.shape
            q = jnp.dot(h, lw["q"], precision=hi).reshape(b, s, heads, d)
            k = jnp.dot(h, lw["k"], precision=hi).reshape(b, s, kv, d)
            v = jnp.dot(h, lw["v"], precision=hi).reshape(b, s, kv, dv)
            theta = self.theta[local]
            q, k = self._rope(q, pos, theta), self._rope(k, pos, theta)
            # Every row writes at the same positions (one batch, one length): a slice update.
            k_cache = jax.lax.dynamic_update_slice(k_cache, k, (0, pos[0, 0], 0, 0))
            v_cache = jax.lax.dynamic_update_slice(v_cache, v, (0, pos[0, 0], 0, 0))
            out.append((k_cache, v_cache))
            group = heads // kv  # query heads per KV head, grouped: no repeated KV
            q = q.reshape(b, s, kv, group, d)
            scores = jnp.einsum("bskgd,btkd->bkgst", q, k_cache, precision=hi) / np.sqrt(d)
            lag = pos[:, None, None, :, None] - keys  # query - key, [b, 1, 1, s, t]
            visible = (lag >= 0) & ((lag <= self.window) if local else True)
            scores = jnp.where(visible, scores, -jnp.inf)
            if lw["sinks"] is not None:  # one more logit per head, dropped after the softmax
                sink = lw["sinks"].reshape(1, kv, group, 1, 1)
                sink = jnp.broadcast_to(sink, (*scores.shape[:-1], 1))
                probs = jax.nn.softmax(jnp.concatenate([scores, sink], -1), -1)[..., :-1]
            else:
                probs = jax.nn.softmax(scores, -1)
            att = jnp.einsum("bkgst,btkd->bskgd", probs, v_cache, precision=hi)
            att = att.reshape(b, s, heads * dv)
            x = x + jnp.dot(att, lw["o"], precision=hi)
            h = self._norm(x, lw["ln2"])
            gate = jax.nn.silu(jnp.dot(h, lw["gate"], precision=hi))
            x = x + jnp.dot(gate * jnp.dot(h, lw["up"], precision=hi), lw["down"], precision=hi)
        x = self._norm(x[:, -1], w["norm"])
        return jnp.dot(x, w["head"], precision=hi), out


@functools.partial(jax.jit, static_argnums=0, donate_argnums=2)
def _prefill(floor, w, cache, prompts):
    pos = jnp.broadcast_to(jnp.arange(prompts.shape[1]), prompts.shape)
    logits, cache = floor.forward(w, cache, prompts, pos)
    return jnp.argmax(logits, -1).astype(jnp.int32), cache


@functools.partial(jax.jit, static_argnums=0, donate_argnums=2)
def _step(floor, w, cache, token, pos):
    logits, cache = floor.forward(w, cache, token[:, None], pos[:, None])
    return jnp.argmax(logits, -1).astype(jnp.int32), cache


@functools.partial(jax.jit, static_argnums=(0, 4), donate_argnums=2)
def _round(floor, w, cache, token, n, pos):
    """`n` greedy steps in one program (a fori_loop), the first feeding `token` at `pos`."""

    def body(i, carry):
        token, cache, out = carry
        at = jnp.broadcast_to(pos + i, token.shape)[:, None]
        logits, cache = floor.forward(w, cache, token[:, None], at)
        token = jnp.argmax(logits, -1).astype(jnp.int32)
        return token, cache, out.at[:, i].set(token)

    out = jnp.zeros((token.shape[0], n), jnp.int32)
    return jax.lax.fori_loop(0, n, body, (token, cache, out))


def run_floor(floor, w, prompts, new, steps=1):
    """(seconds, greedy tokens [b, new]): one program per token, or (`steps` > 1) per `steps`
    tokens, the remainder one at a time; the host reads the tokens once, after the last."""
    t0 = time.perf_counter()
    token, cache = _prefill(floor, w, floor.cache(), jnp.asarray(prompts, jnp.int32))
    tokens, p, done = [token[:, None]], prompts.shape[1], 1
    while done < new:  # the token fed next sits at position p + done - 1
        if steps > 1 and new - done >= steps:
            token, cache, out = _round(floor, w, cache, token, steps, jnp.int32(p + done - 1))
            tokens.append(out)
            done += steps
        else:
            pos = jnp.full(len(prompts), p + done - 1, jnp.int32)
            token, cache = _step(floor, w, cache, token, pos)
            tokens.append(token[:, None])
            done += 1
    out = np.asarray(jax.device_get(jnp.concatenate(tokens, 1)))
    return time.perf_counter() - t0, out


def run_engine(decoder, prompts, new, steps=1, scan=True):
    from swajax.api import EngineSpec, generate, make_engine
    from swajax.serving.sampling_params import SamplingParams

    context = prompts.shape[1] + new + 16
    setup = EngineSpec.of(
        kv_budget_gib=0.05,
        page_size=16,
        chunk_size=None,
        max_running=len(prompts),
        max_context=context,
        decode_steps=steps,
        scan_layers=scan,
    )
    engine = make_engine(decoder, setup)  # pools allocated outside the timed part
    t0 = time.perf_counter()
    reqs, _ = generate(engine, prompts.tolist(), SamplingParams(temperature=0.0, max_tokens=new))
    return time.perf_counter() - t0, np.asarray([r.output for r in reqs])


def random_checkpoint(config: dict, folder: Path):
    """A randomly initialised checkpoint of `config` (MiMo-V2-Flash, dense MLPs) written to
    `folder` in the hub's layout, loaded like any other: the decoder in float32."""
    from safetensors.numpy import save_file

    from swajax.models import load_decoder

    c, rng = config, np.random.default_rng(0)
    h, f, heads = c["hidden_size"], c["intermediate_size"], c["num_attention_heads"]

    def rand(*shape):
        return (rng.standard_normal(shape) * shape[-1] ** -0.5).astype(np.float32)

    t = {
        "model.embed_tokens.weight": rand(c["vocab_size"], h),
        "lm_head.weight": rand(c["vocab_size"], h),
        "model.norm.weight": np.ones(h, np.float32),
    }
    for i, kind in enumerate(c["layer_types"]):
        pre, swa = f"model.layers.{i}", "swa_" if kind == "sliding_attention" else ""
        kv, d, dv = (c[f"{swa}{k}"] for k in ("num_key_value_heads", "head_dim", "v_head_dim"))
        for name, shape in (
            ("q_proj", (heads * d, h)),
            ("k_proj", (kv * d, h)),
            ("v_proj", (kv * dv, h)),
            ("o_proj", (h, heads * dv)),
        ):
            t[f"{pre}.self_attn.{name}.weight"] = rand(*shape)
        if swa:
            t[f"{pre}.self_attn.attention_sink_bias"] = rng.standard_normal(heads).astype(
                np.float32
            )
        for name, shape in (("gate_proj", (f, h)), ("up_proj", (f, h)), ("down_proj", (h, f))):
            t[f"{pre}.mlp.{name}.weight"] = rand(*shape)
        for name in ("input_layernorm", "post_attention_layernorm"):
            t[f"{pre}.{name}.weight"] = np.ones(h, np.float32)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(dict(config, torch_dtype="float32")))
    save_file(t, str(folder / "model.safetensors"))
    return load_decoder(folder, dtype="float32")


def model(wide: bool, folder: Path):
    """(decoder, config): the demo checkpoint in float32, or (`wide`) a random checkpoint of the
    same family, wider and deeper."""
    from swajax.models import load_decoder

    config = json.loads((DEMO / "config.json").read_text())
    if not wide:
        return load_decoder(DEMO, dtype="float32"), config
    n, h, f, heads, kv, d = 8, 512, 1536, 8, 4, 64
    config = dict(
        config,
        hidden_size=h,
        intermediate_size=f,
        num_hidden_layers=n,
        num_attention_heads=heads,
        swa_num_attention_heads=heads,
        num_key_value_heads=kv,
        swa_num_key_value_heads=kv,
        head_dim=d,
        swa_head_dim=d,
        v_head_dim=d,
        swa_v_head_dim=d,
        mlp_layer_types=["dense"] * n,
        layer_types=["sliding_attention"] * 3
        + ["full_attention"]
        + ["sliding_attention"] * 3
        + ["full_attention"],
    )
    return random_checkpoint(config, folder), config


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", default="1,16,64")
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--wide", action="store_true")
    p.add_argument(
        "--decode-steps",
        default="1,8",
        help="the engine's multi-step decode settings to run, side by side",
    )
    p.add_argument("--unroll-layers", action="store_true", help="the engine's layers unrolled")
    p.add_argument("--smoke", action="store_true", help="a tiny run (tests)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    if a.smoke:
        a.batches, a.prompt_len, a.new, a.repeats, a.decode_steps = "2", 8, 6, 1, "1,4"
    import tempfile

    decoder, config = model(a.wide, Path(tempfile.mkdtemp(prefix="swajax_floor_")))
    w = weights_of(decoder)
    rows = []
    for b in map(int, a.batches.split(",")):
        prompts = np.random.default_rng(b).integers(3, config["vocab_size"], (b, a.prompt_len))
        floor = Floor(config, b, a.prompt_len + a.new)
        floor_tokens = run_floor(floor, w, prompts, a.new)[1]  # compiles
        settings = [int(x) for x in a.decode_steps.split(",")]
        runs = {
            ("engine", n): lambda n=n, prompts=prompts: run_engine(
                decoder, prompts, a.new, n, not a.unroll_layers
            )
            for n in settings
        } | {
            ("floor", n): lambda n=n, prompts=prompts, floor=floor: run_floor(
                floor, w, prompts, a.new, n
            )
            for n in sorted({1, *settings})  # one step per program: the floor the goals name
        }
        best = dict.fromkeys(runs, float("inf"))
        for (kind, n), run in runs.items():
            same = (run()[1] == floor_tokens).all(axis=1)
            if not same.all():  # compiled now, and checked: greedy tokens are the floor's
                raise SystemExit(
                    f"batch {b}, {kind} at {n} steps: {int((~same).sum())} of "
                    f"{b} outputs differ from the floor's"
                )
        for _ in range(a.repeats):  # interleaved: every setting sees the same machine
            for key, run in runs.items():
                best[key] = min(best[key], run()[0])
        one = best["floor", 1]
        for n in settings:
            rows.append(
                dict(
                    batch=b,
                    decode_steps=n,
                    engine_tok_s=b * a.new / best["engine", n],
                    floor_tok_s=b * a.new / one,
                    ratio=one / best["engine", n],
                    floor_same_steps_tok_s=b * a.new / best["floor", n],
                    ratio_same_steps=best["floor", n] / best["engine", n],
                )
            )
    if a.json:
        print(json.dumps(rows))
    else:
        print(
            f"{'batch':>5} {'steps':>5} {'engine tok/s':>13} {'floor tok/s':>12} "
            f"{'engine/floor':>13} {'floor, same steps':>18} {'engine/that':>12}"
            "  (greedy tokens identical)"
        )
        for r in rows:
            same = f"{r['floor_same_steps_tok_s']:>18.1f} {r['ratio_same_steps']:>12.2f}"
            print(
                f"{r['batch']:>5} {r['decode_steps']:>5} {r['engine_tok_s']:>13.1f} "
                f"{r['floor_tok_s']:>12.1f} {r['ratio']:>13.2f} {same}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
