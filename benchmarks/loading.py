"""Load time and peak host memory of a synthetic multi-GB checkpoint, lazy loader vs reading it
whole.

    python benchmarks/loading.py [--gib 2] [--json]

Writes a Mistral-shaped bf16 checkpoint of about `--gib` GiB in 4 shards (to a temporary
folder), then in fresh subprocesses loads it (a) with `load_decoder(dtype="bfloat16")` and (b)
the way the loader worked before (every file read whole with safetensors, then each tensor
placed), and reports wall time and peak RSS growth. On CPU the loaded parameters live in host
memory, so the number to read is the growth *beyond the parameters* against the largest shard
file (goal: <= 1.2x); on a GPU/TPU the parameters are in device memory and that excess is the
whole host cost.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

ROOT = Path(__file__).resolve().parents[1]

PROBE = textwrap.dedent(
    """
    import json, sys, time
    import jax
    from swajax.models import load_decoder
    def rss(field):
        for line in open("/proc/self/status"):
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    jax.numpy.zeros(1).block_until_ready()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = rss("VmRSS:")
    start = time.perf_counter()
    if sys.argv[2] == "lazy":
        decoder = load_decoder(sys.argv[1], dtype="bfloat16")
    else:  # read every file whole first, as the loader once did
        from pathlib import Path
        from safetensors.numpy import load_file
        weights = {}
        for f in sorted(Path(sys.argv[1]).glob("*.safetensors")):
            weights.update(load_file(str(f)))
        arrays = {k: jax.device_put(v) for k, v in weights.items()}
        jax.block_until_ready(arrays)
    print(json.dumps({"seconds": time.perf_counter() - start,
                      "growth": rss("VmHWM:") - before}))
    """
)


def write_checkpoint(folder: Path, gib: float) -> dict:
    hidden, inter, vocab = 2048, 8192, 32768
    per_layer = 2 * (hidden * 2048 * 2 + hidden * 512 * 2 + 3 * hidden * inter + 2 * hidden)
    layers = max(1, int((gib * 2**30 - 4 * vocab * hidden) // per_layer))
    cfg = dict(
        model_type="mistral",
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=16,
        num_key_value_heads=4,
        head_dim=128,
        sliding_window=4096,
        max_position_embeddings=32768,
        tie_word_embeddings=False,
    )
    (folder / "config.json").write_text(json.dumps(cfg))
    shapes = {
        "model.embed_tokens.weight": (vocab, hidden),
        "model.norm.weight": (hidden,),
        "lm_head.weight": (vocab, hidden),
    }
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "input_layernorm.weight": (hidden,),
                p + "post_attention_layernorm.weight": (hidden,),
                p + "self_attn.q_proj.weight": (2048, hidden),
                p + "self_attn.k_proj.weight": (512, hidden),
                p + "self_attn.v_proj.weight": (512, hidden),
                p + "self_attn.o_proj.weight": (hidden, 2048),
                p + "mlp.gate_proj.weight": (inter, hidden),
                p + "mlp.up_proj.weight": (inter, hidden),
                p + "mlp.down_proj.weight": (hidden, inter),
            }
        )
    names = sorted(shapes)
    rng = np.random.default_rng(0)
    sizes = []
    for k in range(4):
        part = names[k::4]
        tensors = {n: rng.standard_normal(shapes[n], "f4").astype(ml_dtypes.bfloat16) for n in part}
        file = folder / f"model-{k + 1:05d}-of-00004.safetensors"
        save_file(tensors, str(file))
        sizes.append(file.stat().st_size)
        del tensors
    params = sum(2 * int(np.prod(s)) for s in shapes.values())
    return {"layers": layers, "params_bytes": params, "largest_shard": max(sizes)}


def probe(folder: Path, how: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(folder), how],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int | None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gib", type=float, default=2.0)
    p.add_argument("--json", action="store_true")
    p.add_argument("--smoke", action="store_true", help="a tiny run (tests)")
    a = p.parse_args(argv)
    a.gib = 0.01 if a.smoke else a.gib
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        info = write_checkpoint(folder, a.gib)
        result = {**info, "lazy": probe(folder, "lazy"), "whole": probe(folder, "whole")}
    for how in ("lazy", "whole"):
        r = result[how]
        r["excess_over_params"] = r["growth"] - info["params_bytes"]
        r["excess_vs_largest_shard"] = r["excess_over_params"] / info["largest_shard"]
    if a.json:
        print(json.dumps(result))
        return
    gib = 2**30
    print(
        f"checkpoint: {info['params_bytes'] / gib:.2f} GiB bf16, {info['layers']} layers, "
        f"largest shard {info['largest_shard'] / gib:.2f} GiB"
    )
    for how in ("lazy", "whole"):
        r = result[how]
        print(
            f"{how:>5}: {r['seconds']:.1f} s, peak RSS growth {r['growth'] / gib:.2f} GiB, "
            f"beyond the parameters {r['excess_over_params'] / gib:.2f} GiB = "
            f"{r['excess_vs_largest_shard']:.2f}x the largest shard"
        )


if __name__ == "__main__":
    main()
