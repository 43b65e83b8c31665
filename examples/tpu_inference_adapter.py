"""The conformance kit's attention cases on a peer's kernel: tpu-inference's ragged paged
attention (v3, the kernel vLLM's TPU backend runs), in Pallas's TPU interpret mode on a CPU.

Run it in an environment of its own (tpu-inference pins jax 0.11.2, Python >= 3.12):

    bash tests/peers/setup_tpu_inference.sh            # -> .venvs/tpu-inference
    swajax conformance export KIT --parts attention    # (in swajax's environment)
    .venvs/tpu-inference/bin/python examples/tpu_inference_adapter.py KIT

prints one JSON line per case: {"case", "status": ok | fail | skipped, "detail"}; with
`--reduce`, a failing case is cut down to the smallest one that still fails (fewer requests,
fewer queries, a shorter cached prefix) and printed with it. The kit's runner needs only numpy
of swajax (no JAX of its own), so this runs with the peer's JAX.

How a case maps to the kernel's inputs (the kit's protocol is in swajax/conformance/kit.py):

- the window: the kit's W counts the tokens before the query (W + 1 keys); the kernel's
  `sliding_window` counts the keys (it keeps key k for query q when q - k < sliding_window),
  so it gets W + 1. Chunked attention (Llama 4's local layers) has no counterpart: skipped.
- pages: the kernel reads K and V from one cache array, [pages, page size, heads, ...], built
  with the kernel's own `merge_kv` from the case's K and V pages (page 0, the kit's dummy, is a
  page like any other); the page table rows are its `page_indices`, `seq_lens` its `kv_lens`.
  The queries' own K/V are already in the pages, so the kernel's cache update writes what is
  there.
- head dims: the kernel takes one head dim for K and V; a case whose V is narrower (MLA-like)
  has its V zero-padded to K's and the padding cut from the output (exact).
- sinks: only the head-dim-64 variant (`ragged_paged_attention_hd64`, gpt-oss's) takes
  per-head sinks; a case with sinks runs there, its head dims zero-padded to 64 (q . k and
  the output are unchanged by zero padding).
- soft-capping and the softmax scale map one to one.
- the kernel picks block sizes by TPU generation and a CPU has none: the adapter tells it it
  runs on a v6e (`get_tpu_version`), the tiling a v6e user gets.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.util
import json
import logging
import sys
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
KERNELS = "tpu_inference.kernels.ragged_paged_attention.v3"
TPU_GENERATION, DEVICE_NAME = 6, "TPU v6e"  # the tiling a v6e gets


class _Logger(logging.LoggerAdapter):
    """vLLM's logger's surface: the standard methods and their `_once` forms."""

    def __init__(self, name):
        super().__init__(logging.getLogger(name), {})

    def warning_once(self, msg, *args, **kwargs):
        self.warning(msg, *args, **kwargs)

    def info_once(self, msg, *args, **kwargs):
        self.info(msg, *args, **kwargs)


@functools.cache
def load_kernels():
    """The kernel modules, without running the tpu_inference package's __init__ (it imports
    vLLM and the serving stack; the kernels need only JAX)."""
    spec = importlib.util.find_spec("tpu_inference")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("tpu-inference is not installed: bash tests/peers/setup_tpu_inference.sh")
    root = Path(spec.submodule_search_locations[0])
    parts = KERNELS.split(".")
    for i in range(1, len(parts)):
        name = ".".join(parts[:i])
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(root.joinpath(*parts[1:i]))]
            sys.modules[name] = package

    # Two helpers the tuning tables import from outside the kernels, stood in for: vLLM's
    # logger (the standard one will do) and the device name that keys the tuned block sizes
    # (tpu_inference.utils imports torch; a v6e's name, as `get_tpu_version` below).
    stand_ins = {
        "tpu_inference.logger": dict(init_logger=_Logger),
        "tpu_inference.utils": dict(get_device_name=lambda num_devices=None: DEVICE_NAME),
    }
    for name, attributes in stand_ins.items():
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__dict__.update(attributes)
            sys.modules[name] = module
    util = importlib.import_module(f"{KERNELS}.util")
    util.get_tpu_version = lambda: TPU_GENERATION  # before the modules that import it by name
    return (
        importlib.import_module(f"{KERNELS}.kernel"),
        importlib.import_module(f"{KERNELS}.kernel_hd64"),
    )


class TpuInferenceAdapter:
    """The kit's adapter interface (`swajax.conformance.adapter`): attention only.

    `run`: "kernel" (the Pallas kernel, TPU interpret mode) or "reference" (the dense JAX
    reference the peer tests its kernel against, `ref_ragged_paged_attention[_hd64]`).
    `poison`: "nan" runs the cases as exported (every row a backend must not read is NaN);
    "finite" first fills those rows with finite values, as a freed and reused page holds: the
    math and the window rule alone decide the answer."""

    def __init__(self, run: str = "kernel", poison: str = "nan"):
        self.run, self.poison = run, poison
        import jax
        from jax.experimental.pallas import tpu as pltpu

        jax.config.update("jax_enable_x64", False)
        self.jax, self.pltpu = jax, pltpu
        self.main, self.hd64 = load_kernels()

    def allocator_and_cache(self, header):
        raise NotImplementedError("tpu-inference's memory system is vLLM's, not this protocol")

    def logits(self, model_dir, prompt):
        raise NotImplementedError("a kernel, not a model")

    def attention(self, case: dict) -> np.ndarray:
        jnp = self.jax.numpy
        kind = str(case["kind"])
        if kind == "chunked":
            raise NotImplementedError("the kernel has no chunked-attention mask (Llama 4)")
        sinks = case.get("sinks")
        q, k_pages, v_pages = case["q"], case["k_pages"], case["v_pages"]
        if self.poison == "finite":
            rng = np.random.default_rng(0)
            k_pages, v_pages = (
                np.where(np.isnan(x), rng.normal(size=x.shape), x).astype(x.dtype)
                for x in (k_pages, v_pages)
            )
        hkv, dk, dv = k_pages.shape[2], k_pages.shape[3], v_pages.shape[3]
        d = 64 if sinks is not None else max(dk, dv)
        if d < max(dk, dv):
            raise NotImplementedError(f"sinks need head dim 64 here; the case has {dk}/{dv}")
        pad = lambda x: np.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, d - x.shape[-1])])  # noqa: E731
        q, k_pages, v_pages = pad(q), pad(k_pages), pad(v_pages)
        pages, ps = k_pages.shape[:2]
        module = self.hd64 if sinks is not None else self.main
        cache = module.merge_kv(
            jnp.asarray(k_pages.reshape(pages * ps, hkv, d)),
            jnp.asarray(v_pages.reshape(pages * ps, hkv, d)),
        )
        cache = cache.reshape(pages, ps, *cache.shape[1:])
        prefix, seq = case["prefix_lens"].astype(np.int32), case["seq_lens"].astype(np.int32)
        table = case["page_table"].astype(np.int32)
        n = len(seq)
        # The queries' own K and V, gathered from their pages (the cache update rewrites them).
        rows = [table[r, p // ps] * ps + p % ps for r in range(n) for p in range(prefix[r], seq[r])]
        flat_k, flat_v = k_pages.reshape(-1, hkv, d), v_pages.reshape(-1, hkv, d)
        keys, values = jnp.asarray(flat_k[rows]), jnp.asarray(flat_v[rows])
        cu_q = np.concatenate([[0], np.cumsum(seq - prefix)]).astype(np.int32)
        decode = bool(np.all(seq - prefix == 1))
        distribution = np.array([n, n, n] if decode else [0, 0, n], np.int32)
        window = int(case["window"]) + 1 if kind == "sliding" else None
        cap = float(case["soft_cap"]) if "soft_cap" in case else None
        args = (
            jnp.asarray(q),
            keys,
            values,
            cache,
            jnp.asarray(seq),
            jnp.asarray(table.reshape(-1)),
            jnp.asarray(cu_q),
            jnp.asarray(distribution),
        )
        options = dict(sm_scale=float(case["scale"]), sliding_window=window, soft_cap=cap)
        if self.run == "reference":
            if sinks is not None:
                out = self.hd64.ref_ragged_paged_attention_hd64(
                    *args, jnp.asarray(sinks), **options
                )
            else:
                out = self.main.ref_ragged_paged_attention(*args, **options)
        else:
            vmem = 64 * 1024 * 1024
            with self.pltpu.force_tpu_interpret_mode():
                if sinks is not None:
                    out = self.hd64.ragged_paged_attention_hd64(
                        *args, jnp.asarray(sinks), vmem_limit_bytes=vmem, **options
                    )
                else:
                    out = self.main.ragged_paged_attention(*args, vmem_limit_bytes=vmem, **options)
        out = out[0] if isinstance(out, tuple) else out
        return np.asarray(out, np.float64)[:, :, :dv]


def reduce(case: dict, fails) -> dict:
    """The smallest case that still fails: requests dropped one at a time, then each request's
    queries and cached prefix shortened, while `fails(case)` holds."""
    sys.path.insert(0, str(ROOT))
    from swajax.conformance.attention_cases import expected_output

    def variant(keep, prefix, seq):
        ps = case["k_pages"].shape[1]
        table = case["page_table"][keep]
        width = max(1, int(np.max(-(-seq // ps))))
        out = dict(case, page_table=np.ascontiguousarray(table[:, :width]))
        out.update(prefix_lens=prefix.astype(np.int32), seq_lens=seq.astype(np.int32))
        starts = np.concatenate([[0], np.cumsum(case["seq_lens"] - case["prefix_lens"])])
        out["q"] = np.concatenate(
            [
                case["q"][
                    starts[r] + (p - case["prefix_lens"][r]) : starts[r]
                    + (s - case["prefix_lens"][r])
                ]
                for r, p, s in zip(keep, prefix, seq)
            ]
        )
        out["expected"] = expected_output(out)
        return out

    keep = list(range(len(case["seq_lens"])))
    prefix, seq = case["prefix_lens"].copy(), case["seq_lens"].copy()
    current = case
    changed = True
    while changed:
        changed = False
        for drop in range(len(keep)):
            if len(keep) == 1:
                break
            idx = [i for i in range(len(keep)) if i != drop]
            trial = variant([keep[i] for i in idx], prefix[idx], seq[idx])
            if fails(trial):
                keep, prefix, seq, current, changed = (
                    [keep[i] for i in idx],
                    prefix[idx],
                    seq[idx],
                    trial,
                    True,
                )
                break
        for r in range(len(keep)):
            for shorter in ((prefix[r], seq[r] - 1), (prefix[r] + 1, seq[r])):
                p, s = shorter
                # a query stays (s > p); the cached prefix only moves within the same live pages
                if s <= p:
                    continue
                new_p, new_s = prefix.copy(), seq.copy()
                new_p[r], new_s[r] = p, s
                trial = variant(keep, new_p, new_s)
                if fails(trial):
                    prefix, seq, current, changed = new_p, new_s, trial, True
                    break
    return current


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kit")
    p.add_argument("--reduce", action="store_true", help="cut each failing case down")
    p.add_argument("--run", choices=("kernel", "reference"), default="kernel")
    p.add_argument("--poison", choices=("nan", "finite"), default="nan")
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from swajax.conformance import kit as kit_lib
    from swajax.conformance.oracle import compare

    adapter = TpuInferenceAdapter(args.run, args.poison)
    manifest = json.loads((Path(args.kit) / "manifest.json").read_text())
    tolerance = {c["name"]: c["tolerance"] for c in manifest["cases"]}
    for result in kit_lib.run(args.kit, adapter):
        line = dict(
            case=result.name,
            run=args.run,
            poison=args.poison,
            status=result.status,
            detail=result.detail,
        )
        if result.status == "fail" and args.reduce and result.kind == "attention":
            case = dict(np.load(Path(args.kit) / "attention" / f"{result.name}.npz"))

            def fails(c, rtol=tolerance[result.name]):
                try:
                    return not compare(adapter.attention(c), c["expected"], rtol=rtol).ok
                except Exception:  # noqa: BLE001 - a crash still fails
                    return True

            small = reduce(case, fails)
            line["smallest"] = dict(
                prefix_lens=small["prefix_lens"].tolist(),
                seq_lens=small["seq_lens"].tolist(),
                window=int(small["window"]),
                page_size=int(small["k_pages"].shape[1]),
                detail=str(
                    compare(
                        adapter.attention(small), small["expected"], rtol=tolerance[result.name]
                    )
                ),
            )
        print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
