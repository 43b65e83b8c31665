"""Checkpoints as users have them: folders in `huggingface_hub`'s cache layout (every file a
symlink into blobs/), index names that would leave the folder (refused the same way with or
without symlinks), and weights that are not finite (named at load)."""

import hashlib
import json
import pathlib
import shutil

import jax
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save, save_file

from swajax.models import load_decoder
from swajax.models.checkpoint import LoadError

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures"


def _shards(src: pathlib.Path, n: int) -> dict[str, bytes]:
    """The fixture's files with its weights split over `n` shards and an index, as bytes."""
    tensors = load_file(src / "model.safetensors")
    names = sorted(tensors)
    files = {"config.json": (src / "config.json").read_bytes()}
    weight_map = {}
    for i in range(n):
        shard = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        part = {k: tensors[k] for k in names[i::n]}
        weight_map.update(dict.fromkeys(part, shard))
        files[shard] = save(part)
    index = {"metadata": {}, "weight_map": weight_map}
    files["model.safetensors.index.json"] = json.dumps(index).encode()
    return files


def hub_snapshot(root: pathlib.Path, files: dict[str, bytes]) -> pathlib.Path:
    """`root/models--org--name/snapshots/<rev>/` with each file a relative symlink into
    `../../blobs/<sha256>`, as `huggingface_hub.snapshot_download` leaves it."""
    repo = root / "models--org--name"
    blobs, snapshot = repo / "blobs", repo / "snapshots" / ("0" * 40)
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    for name, data in files.items():
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        (snapshot / name).symlink_to(pathlib.Path("..", "..", "blobs", digest))
    return snapshot


def _params(decoder) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(nnx.state(decoder))]


@pytest.fixture(scope="module")
def reference():
    return _params(load_decoder(FIXTURES / "qwen3"))


@pytest.mark.parametrize("shards", [1, 2])
def test_a_hub_cache_snapshot_loads(tmp_path, reference, shards):
    src = FIXTURES / "qwen3"
    if shards == 1:  # one un-indexed file, as small checkpoints are published
        files = {n: (src / n).read_bytes() for n in ("config.json", "model.safetensors")}
    else:
        files = _shards(src, shards)
    snapshot = hub_snapshot(tmp_path, files)
    assert all(p.is_symlink() for p in snapshot.iterdir())
    got = _params(load_decoder(snapshot))
    assert len(got) == len(reference)
    for a, b in zip(got, reference):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("symlinks", [False, True])
@pytest.mark.parametrize(
    "name",
    [
        "../model-00001-of-00002.safetensors",
        "ABSOLUTE",  # an absolute path, made under tmp_path below
        "sub/../../x.safetensors",
        "..\\x.safetensors",
    ],
)
def test_an_index_naming_a_file_outside_is_refused(tmp_path, name, symlinks):
    files = _shards(FIXTURES / "qwen3", 2)
    index = json.loads(files["model.safetensors.index.json"])
    first = next(iter(index["weight_map"]))
    if name == "ABSOLUTE":
        name = str(tmp_path / "elsewhere" / "x.safetensors")
    index["weight_map"][first] = name
    files["model.safetensors.index.json"] = json.dumps(index).encode()
    if symlinks:
        folder = hub_snapshot(tmp_path, files)
    else:
        folder = tmp_path / "plain"
        folder.mkdir()
        for n, data in files.items():
            (folder / n).write_bytes(data)
    with pytest.raises(LoadError, match="leaves the checkpoint folder"):
        load_decoder(folder)


def _copy(src: pathlib.Path, dst: pathlib.Path, edit) -> pathlib.Path:
    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    edit(tensors)
    save_file(tensors, dst / "model.safetensors")
    return dst


@pytest.mark.parametrize("split", [1, 4])
def test_a_nan_weight_is_named_at_load(tmp_path, split):
    """Named with its index in the stored tensor, also when each device's shard is checked as
    it is read (split four ways, the NaN sits in the second device's rows of the stored
    [hidden, intermediate] down projection, i.e. its transposed kernel's second shard)."""
    from swajax.models.sharding import kv_mesh

    name = "model.layers.1.mlp.down_proj.weight"

    def poison(t):
        t[name] = t[name].copy()
        t[name][3, 45] = np.nan

    folder = _copy(FIXTURES / "qwen3_kv4", tmp_path / "nan", poison)
    message = rf"tensor '{name}' holds a non-finite value \(nan\) at index \(3, 45\)"
    with pytest.raises(LoadError, match=message):
        load_decoder(folder, mesh=kv_mesh(split) if split > 1 else None)


def test_the_cli_names_the_non_finite_tensor(tmp_path, cli):
    name = "model.embed_tokens.weight"

    def poison(t):
        t[name] = t[name].copy()
        t[name][0, 0] = np.inf

    folder = _copy(FIXTURES / "qwen3", tmp_path / "inf", poison)
    code, out, err = cli("generate", "--model", folder, "--prompt-ids", "1,2")
    assert code == 2 and name in err and "non-finite" in err and out == ""


@pytest.mark.parametrize("scale, match", [(255, "reserves for NaN"), (254, "non-finite")])
def test_mxfp4_scales_that_overflow_are_named(tmp_path, scale, match):
    name = "model.layers.2.mlp.experts.gate_up_proj"

    def poison(t):
        t[f"{name}_scales"] = t[f"{name}_scales"].copy()
        t[f"{name}_scales"][1, 3, 0] = scale
        blocks = t[f"{name}_blocks"].copy()
        blocks[1, 3, 0, :] = 0x77  # +6.0 in both nibbles: 6 * 2**127 overflows float32
        t[f"{name}_blocks"] = blocks

    folder = _copy(FIXTURES / "gpt_oss_mxfp4", tmp_path / "mx", poison)
    with pytest.raises(LoadError, match=match) as e:
        load_decoder(folder)
    assert name in str(e.value)
