"""swajax's paged decode kernel beside tpu-inference's ragged paged attention (v3, vLLM's TPU
kernel), both compiled by the TPU compiler for a v6e (libtpu's compile-only devices: no TPU
needed), on the same published decode shapes: does each compile, its compiled memory
(`memory_analysis()`), and XLA's modeled cost (`cost_analysis()`: modeled, never measured).

    python benchmarks/peer_kernel_tpu.py                 # both, side by side (markdown)
    python benchmarks/peer_kernel_tpu.py --smoke         # swajax's side of one shape
    python benchmarks/peer_kernel_tpu.py --side swajax   # one side, JSON lines
    .venvs/tpu-inference/bin/python benchmarks/peer_kernel_tpu.py --side tpu-inference

The peer runs in its own environment (`bash tests/peers/setup_tpu_inference.sh`: jax 0.11.2 and
libtpu 0.0.48, as tpu-inference pins them); swajax's side in swajax's (jax 0.10.2 and its
libtpu). The windows: swajax's W counts the tokens before the query, the peer's
`sliding_window` the keys, W + 1.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PEER_PYTHON = ROOT / ".venvs" / "tpu-inference" / "bin" / "python"
BATCH, COLUMNS = 8, 64  # decode rows, page-table columns per row
# name: (head dim, query heads, KV heads, page size, pool pages, W, sinks, soft cap)
SHAPES = {
    "gpt-oss-120b": (64, 64, 8, 16, 1024, 127, True, None),
    "gemma-3-27b": (128, 32, 16, 64, 512, 1023, False, 50.0),
    "step-3.5-flash": (128, 96, 8, 128, 512, 511, False, None),
}


def _summary(compiled) -> dict:
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return dict(
        argument_bytes=int(memory.argument_size_in_bytes),
        output_bytes=int(memory.output_size_in_bytes),
        temp_bytes=int(memory.temp_size_in_bytes),
        code_bytes=int(memory.generated_code_size_in_bytes),
        modeled_seconds=float(cost.get("optimal_seconds", float("nan"))),
        flops=float(cost.get("flops", 0.0)),
        bytes_accessed=float(cost.get("bytes accessed", 0.0)),
    )


def _device():
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v6e-4")
    from jax.experimental import topologies

    return topologies.get_topology_desc(topology_name="v6e:2x2", platform="tpu").devices[0]


def swajax_side(name, shape) -> dict:
    import jax
    import jax.numpy as jnp

    from swajax import tpu
    from swajax.kernels.paged_decode import paged_decode

    d, hq, hkv, ps, pages, window, sinks, cap = shape
    s = jax.ShapeDtypeStruct
    # The pools as the engine stores them (`memory.pool`: a page's heads side by side), viewed
    # per head inside the program, as the model does: the two reshapes cancel.
    args = (
        s((BATCH, hkv, hq // hkv, d), jnp.bfloat16),
        s((pages, ps, hkv * d), jnp.bfloat16),
        s((pages, ps, hkv * d), jnp.bfloat16),
        s((BATCH, COLUMNS), jnp.int32),
        s((BATCH,), jnp.int32),
        s((BATCH,), jnp.int32),
        s((hkv, hq // hkv), jnp.float32) if sinks else None,
    )
    statics = dict(kind="sliding", window=window, scale=d**-0.5, soft_cap=cap, backend="tpu")

    def decode(q, k, v, *rest):
        per_head = (pages, ps, hkv, d)
        return paged_decode(q, k.reshape(per_head), v.reshape(per_head), *rest, **statics)

    return _summary(tpu.compile_on(_device(), jax.jit(decode), *args))


def peer_side(name, shape) -> dict:
    import jax
    import jax.numpy as jnp
    from jax.sharding import AbstractDevice, AbstractMesh, AxisType

    sys.path.insert(0, str(ROOT / "examples"))
    from tpu_inference_adapter import load_kernels

    main, hd64 = load_kernels()
    d, hq, hkv, ps, pages, window, sinks, cap = shape
    device = _device()
    sharding = jax.sharding.SingleDeviceSharding(device)

    def s(shape_, dtype):
        return jax.ShapeDtypeStruct(shape_, dtype, sharding=sharding)

    module = hd64 if sinks else main
    cache = module.get_kv_cache_shape(pages, ps, hkv, d, jnp.bfloat16)
    args = [
        s((BATCH, hq, d), jnp.bfloat16),
        s((BATCH, hkv, d), jnp.bfloat16),
        s((BATCH, hkv, d), jnp.bfloat16),
        s(cache, jnp.bfloat16),
        s((BATCH,), jnp.int32),
        s((BATCH * COLUMNS,), jnp.int32),
        s((BATCH + 1,), jnp.int32),
        s((3,), jnp.int32),
    ]
    options = dict(sm_scale=d**-0.5, sliding_window=window + 1, soft_cap=cap)
    abstract = AbstractDevice(device_kind=device.device_kind, num_cores=1, platform="tpu")
    mesh = AbstractMesh((1,), ("x",), axis_types=(AxisType.Auto,), abstract_device=abstract)
    with jax.sharding.use_abstract_mesh(mesh):
        if sinks:
            fn = hd64.ragged_paged_attention_hd64
            lowered = fn.lower(*args, s((hq,), jnp.float32), **options)
        else:
            lowered = main.ragged_paged_attention.lower(*args, **options)
        return _summary(lowered.compile())


def run_side(side: str) -> int:
    import warnings

    warnings.filterwarnings("ignore")  # donation notes and libtpu's start-up chatter
    fn = swajax_side if side == "swajax" else peer_side
    for name, shape in SHAPES.items():
        try:
            row = dict(shape=name, side=side, compiled=True, **fn(name, shape))
        except Exception as e:  # noqa: BLE001 - a compile error is this row's result
            row = dict(shape=name, side=side, compiled=False, error=f"{type(e).__name__}: {e}")
        print(json.dumps(row), flush=True)
    return 0


def _rows(python: str, side: str) -> list[dict]:
    env = dict(os.environ, ALLOW_MULTIPLE_LIBTPU_LOAD="1")
    if side != "swajax":  # the peer's JAX loads its own libtpu and knows its own flags
        env = {k: v for k, v in env.items() if k not in ("XLA_FLAGS", "TPU_LIBRARY_PATH")}
    run = subprocess.run(
        [python, __file__, "--side", side], capture_output=True, text=True, env=env, timeout=1200
    )
    rows = [json.loads(x) for x in run.stdout.splitlines() if x.startswith("{")]
    if not rows:
        raise SystemExit(f"{side}: no result\n{run.stderr[-2000:]}")
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--side", choices=("swajax", "tpu-inference"))
    p.add_argument("--peer-python", default=str(PEER_PYTHON))
    p.add_argument("--smoke", action="store_true", help="swajax's side of one shape (tests)")
    args = p.parse_args(argv)
    if args.side:
        return run_side(args.side)
    if args.smoke:  # in this process, without the peer's environment
        name = next(iter(SHAPES))
        rows = [dict(shape=name, side="swajax", compiled=True, **swajax_side(name, SHAPES[name]))]
    else:
        rows = _rows(sys.executable, "swajax") + _rows(args.peer_python, "tpu-inference")
    print("| shape | kernel | compiles | arguments | output | temp | modeled time | flops |")
    print("|---|---|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: (r["shape"], r["side"])):
        if not r["compiled"]:
            print(f"| {r['shape']} | {r['side']} | no: {r['error'][:80]} | | | | | |")
            continue
        mib = lambda b: f"{b / 2**20:.1f} MiB"  # noqa: E731
        print(
            f"| {r['shape']} | {r['side']} | yes | {mib(r['argument_bytes'])} | "
            f"{mib(r['output_bytes'])} | {r['temp_bytes'] / 2**10:.0f} KiB | "
            f"{r['modeled_seconds'] * 1e6:.2f} us | {r['flops']:.3g} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
