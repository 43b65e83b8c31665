"""Load a model from a Hugging Face checkpoint directory (config.json + *.safetensors, read
lazily with numpy, no torch) or from an orbax checkpoint written by `swajax convert`."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from pathlib import Path, PurePosixPath, PureWindowsPath

import jax
from flax import nnx
from jax.sharding import NamedSharding, make_single_device_sharding

from swajax.config import ConfigError, text_config
from swajax.folder_swap import CONVERT_MARKER, FolderError, swap_in
from swajax.models.checkpoint import Checkpoint, LoadError
from swajax.models.decoder import Decoder, decoder_for
from swajax.models.family_specs import model_spec
from swajax.models.quantization import Quantization, quantization
from swajax.models.sharding import check_divisible, fitted, param_spec
from swajax.models.spec import ModelSpec
from swajax.models.weights import WeightLoader
from swajax.progress_bar import progress

ORBAX_DIR = "params"
LOG = logging.getLogger(__name__)


def read_config(path: str | Path) -> dict:
    path = Path(path)
    try:
        cfg = json.loads((path / "config.json").read_text())
    except FileNotFoundError as e:
        raise ConfigError(f"{path} has no config.json") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path / 'config.json'} is not valid JSON: {e}") from e
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path / 'config.json'} must hold a JSON object")
    return cfg


def member(folder: Path, name) -> Path:
    """`folder / name` for a file name an index gives (or a file found in the folder): a
    relative path below the folder, with no `..`, no absolute path, drive or backslash. The
    rule is about names, not where symlinks lead: a `huggingface_hub` snapshot links every
    file into the cache's blobs/, and a link the folder's owner made is followed, as every
    loader does."""
    if not isinstance(name, str) or not name:
        raise LoadError(f"checkpoint file name {name!r} is not a file name")
    pure = PurePosixPath(name)
    if (
        pure.is_absolute()
        or ".." in pure.parts
        or "\\" in name
        or PureWindowsPath(name).drive
        or name.startswith("~")
    ):
        raise LoadError(
            f"checkpoint file name {name!r} leaves the checkpoint folder {folder}: "
            "an index may name files inside it only"
        )
    return folder / pure


def checkpoint_files(path: Path) -> list[Path]:
    """The .safetensors files of a checkpoint: those the index names, or every one."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            names = sorted(set(weight_map.values()))
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
            raise LoadError(f"{index} must be JSON with a 'weight_map' object") from None
    else:
        names = sorted(f.name for f in path.glob("*.safetensors"))
    return [member(path, name) for name in names]


DTYPES = ("float32", "bfloat16", "float16")
# The checkpoint's own dtype, as vLLM and SGLang default to. On CPU too: XLA:CPU computes a
# bfloat16 product in float32 (about as fast as float32 weights once widened where read,
# `layers.unhoisted`), and float32 weights would take twice the checkpoint's bytes: at
# published shapes the difference between fitting the machine and not (BUILD_NOTES.md).
AUTO = "auto"
MOE_MODES = ("auto", "routed", "dense")
# Tensors a checkpoint may carry that no model here reads (as transformers ignores them): old
# RoPE buffers, a stored copy of tied embeddings, MiMo's multi-token-prediction layers.
IGNORED = (r"\.rotary_emb\.inv_freq$",)
IGNORED_BY_FAMILY = {
    "mimo": (r"^model\.mtp\.",),
    # DeepSeek-V4's multi-token-prediction layers (declared in the config, not run).
    "deepseek_v4": (r"^(model\.)?mtp\.",),
    # The towers and projectors of the multimodal checkpoints (at the top, or under `model.` in
    # transformers 5's layout): the text model reads none of them. Anything else unread is
    # still an error naming it.
    "step3": (r"^vision_model\.", r"^vit_large_projector\."),
    "gemma": (r"^(model\.)?vision_tower\.", r"^(model\.)?multi_modal_projector\."),
    "llama4": (r"^(model\.)?vision_model\.", r"^(model\.)?multi_modal_projector\."),
    "gemma4": (
        r"^(model\.)?(vision_tower|audio_tower)\.",
        r"^(model\.)?(embed_vision|embed_audio)\.",
    ),
}


def load_decoder(
    path: str | Path,
    *,
    dtype: str = "auto",
    moe: str = "auto",
    mesh=None,
    dequantize_weights: bool = False,
) -> Decoder:
    """A `Decoder` with the weights of `path` (a HF checkpoint or a `swajax convert` output).

    Built abstractly and filled one tensor at a time, each straight into its final placement
    (`mesh`: tensor parallel, see `swajax.models.sharding`) and `dtype`. A checkpoint tensor
    the model does not read is an error naming it. Quantized checkpoints (MXFP4 experts, block
    FP8 projections) stay quantized on the device and are dequantized inside the jitted
    computation; `dequantize_weights` dequantizes them to `dtype` at load instead. `dtype`
    "auto": the checkpoint's own (`checkpoint_dtype`), on every backend.
    """
    path = Path(path)
    cfg = read_config(path)
    dtype = checkpoint_dtype(path) if dtype == AUTO else dtype
    spec = decoder_spec(cfg, dtype=dtype, moe=moe, dequantize_weights=dequantize_weights)
    orbax = (path / ORBAX_DIR).exists()
    if orbax:
        if dequantize_weights and checkpoint_quantization(cfg).method is not None:
            raise LoadError(
                f"{path} holds its weights quantized as converted; dequantize them when "
                "converting (swajax convert SRC OUT --dequantize-weights)"
            )
        spec = dataclasses.replace(spec, kv_scales=bool(cfg.get(KV_SCALES_FIELD)))
        return _restore_orbax(_abstract(spec, mesh), path / ORBAX_DIR, mesh)
    files = checkpoint_files(path)
    if not files:
        raise LoadError(f"{path} has no .safetensors files (and no {ORBAX_DIR}/ checkpoint)")
    checkpoint = Checkpoint(files, ignored_patterns(spec, cfg))
    kv_scales = any(n.endswith(KV_SCALE) for n in checkpoint.names())
    decoder = _abstract(dataclasses.replace(spec, kv_scales=kv_scales), mesh)
    LOG.info(
        "loading %s: %d tensors in %d file(s) as %s",
        path,
        len(checkpoint.names()),
        len(files),
        dtype,
    )
    parameters = sum(isinstance(node, nnx.Variable) for _, node in nnx.iter_graph(decoder))
    with progress(parameters, f"loading {path.name}") as advance:
        loader = WeightLoader(checkpoint, decoder, checkpoint_quantization(cfg), mesh, advance)
        decoder.load(loader)
    loader.check_complete(decoder)
    LOG.info(
        "read %d bytes of weights from %d bytes of checkpoint files",
        loader.bytes_read,
        sum(f.stat().st_size for f in files),
    )
    return decoder


def _abstract(spec: ModelSpec, mesh) -> Decoder:
    """The decoder of `spec` as shapes only (checked against the mesh first)."""
    if mesh is not None:
        check_divisible(spec, mesh)
    return nnx.eval_shape(lambda: decoder_for(spec))


def decoder_spec(
    cfg: dict, *, dtype: str = "float32", moe: str = "auto", dequantize_weights: bool = False
) -> ModelSpec:
    """The `ModelSpec` a load with these options builds (its parameters are what the device
    will hold: `swajax.models.footprint` counts them without loading anything)."""
    if dtype not in DTYPES:
        raise ConfigError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if moe not in MOE_MODES:
        raise ConfigError(f"moe must be one of {MOE_MODES}, got {moe!r}")
    kept = Quantization() if dequantize_weights else checkpoint_quantization(cfg)
    return dataclasses.replace(model_spec(cfg), dtype=dtype, moe=moe, weights=kept)


# An FP8 KV cache's per-layer scales as checkpoints ship them; a converted (orbax) folder has no
# tensors to look at, so its config.json says so in this field.
KV_SCALE = ".self_attn.k_scale"
KV_SCALES_FIELD = "swajax_kv_scales"


def checkpoint_quantization(cfg: dict) -> Quantization:
    """The `quantization_config` of a config (at the top of a multimodal wrapper, or in its
    `text_config`)."""
    return quantization(cfg if "quantization_config" in cfg else text_config(cfg)[1])


def ignored_patterns(spec: ModelSpec, cfg: dict) -> tuple[str, ...]:
    """Patterns of the checkpoint tensors a model of `spec` (config `cfg`) knowingly skips."""
    text = text_config(cfg)[1]
    ignore = IGNORED + IGNORED_BY_FAMILY.get(spec.family, ())
    # Step 3.x numbers its multi-token-prediction layers after the decoder's (transformers
    # ignores them; the decoder never runs them).
    mtp = text.get("num_nextn_predict_layers") or 0
    if spec.family == "step3" and isinstance(mtp, int) and mtp > 0:
        n = spec.num_layers
        layers = "|".join(str(i) for i in range(n, n + mtp))
        ignore += (rf"^model\.layers\.({layers})\.",)
    if spec.tie_embeddings:
        ignore += (r"^lm_head\.weight$",)
    # Gemma 4 checkpoints may keep K/V projections of KV-shared layers, which read another
    # layer's KV (transformers ignores them too).
    shared = [i for i, la in enumerate(spec.hybrid.layers) if la.kv_source is not None]
    if shared:
        layers = "|".join(map(str, shared))
        ignore += (rf"^model\.layers\.({layers})\.self_attn\.(k_proj|v_proj|k_norm|v_norm)\.",)
    return ignore


def _checkpointer():
    import orbax.checkpoint as ocp

    return ocp.StandardCheckpointer()


# Not copied beside the converted params: the weights, and a Python package marker (the demo).
NOT_COPIED = ("*.safetensors", "model.safetensors.index.json", "__init__.py")


def checkpoint_dtype(path: str | Path) -> str:
    """The dtype a checkpoint's config says its weights are (`dtype`, or the older
    `torch_dtype`; in multimodal wrappers under `text_config`): one of DTYPES, else float32."""
    cfg = read_config(path)
    for fields in (cfg, cfg.get("text_config") or {}):
        for key in ("dtype", "torch_dtype"):
            if fields.get(key) in DTYPES:
                return fields[key]
    return "float32"


def save_orbax(decoder: Decoder, source: str | Path, out: str | Path, *, force=False) -> None:
    """Write converted params as an orbax checkpoint beside the checkpoint's other files:
    config.json, generation_config.json, the tokenizer and chat template (every file of
    `source` but the safetensors weights and their index), so a converted folder generates from
    text and stops where the original does.

    Built in a temporary folder beside `out` and swapped into place at the end
    (`swajax.folder_swap`): a failed or killed conversion leaves `out` as it was, and the next
    run cleans up after a killed one. A non-empty `out` is refused unless `force`.
    """
    source = Path(source)

    def build(folder: Path) -> None:
        for file in sorted(source.iterdir()):
            skip = any(file.match(pattern) for pattern in NOT_COPIED)
            if file.is_file() and not skip:
                shutil.copy(file, folder / file.name)  # a hub snapshot's links are followed
        cfg = read_config(folder)
        held = _as_held(json.loads(json.dumps(cfg)), decoder)
        if held != cfg:  # else the checkpoint's own file stays, byte for byte
            (folder / "config.json").write_text(json.dumps(held, indent=2))
        checkpointer = _checkpointer()
        checkpointer.save(folder / ORBAX_DIR, nnx.state(decoder))
        checkpointer.wait_until_finished()

    try:
        swap_in(out, build, force=force, source=source, marker=CONVERT_MARKER)
    except FolderError as e:
        raise LoadError(str(e)) from None


def _as_held(cfg: dict, decoder: Decoder) -> dict:
    """A converted folder's config.json says what its params are: no `quantization_config`
    where they were dequantized, and whether per-layer KV scales are among them."""
    if decoder.spec.weights.method is None:
        for fields in (cfg, cfg.get("text_config")):
            if isinstance(fields, dict):
                fields.pop("quantization_config", None)
    if decoder.spec.kv_scales:
        cfg[KV_SCALES_FIELD] = True
    cfg["dtype"] = decoder.spec.dtype  # what the params are (`checkpoint_dtype` reads it)
    cfg.pop("torch_dtype", None)
    return cfg


def _restore_orbax(decoder: Decoder, path: Path, mesh) -> Decoder:
    """Each parameter restored straight into its placement: its shards over `mesh` (across
    processes, each reads its own), else this process's first device. Without the shardings
    orbax would place by the topology the checkpoint was saved from."""
    graphdef, abstract = nnx.split(decoder)
    one = make_single_device_sharding(jax.local_devices()[0])

    def placed(where, x):
        if mesh is None:
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one)
        spec = fitted(param_spec(where), x.shape, mesh)
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, spec))

    abstract = jax.tree_util.tree_map_with_path(placed, abstract)
    checkpointer = _checkpointer()
    saved = checkpointer.metadata(path.resolve()).item_metadata
    heads = [n for n in HEADS if n in abstract and "kernel" in (saved.get(n) or {})]
    for name in heads:  # read as written, [H, V]
        weight = abstract[name]["weight"]
        v = weight.get_value()
        held = jax.ShapeDtypeStruct(v.shape[::-1], v.dtype, sharding=v.sharding)
        abstract[name] = nnx.State({"kernel": weight.replace(held)})
    state = checkpointer.restore(path.resolve(), abstract)
    for name in heads:
        kernel = state[name]["kernel"]
        state[name] = nnx.State({"weight": kernel.replace(kernel.get_value().T)})
    return nnx.merge(graphdef, state)


# The untied vocabulary heads (`layers.Head`, [V, H]) by their module names. Folders converted
# before 2026-12-06 hold them as a `Linear` kernel [H, V] (`NAME.kernel`): restored as written
# and transposed, so those folders keep loading.
HEADS = ("lm_head", "head")


def spec_of(path: str | Path) -> ModelSpec:
    return model_spec(read_config(path))
