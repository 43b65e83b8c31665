"""Bad input at every edge of the command line: each case exits with status 2, prints one line
naming the value (no traceback), and changes no file."""

import json
import shutil

import pytest
from helpers import FIXTURES

GOOD_CONFIG = json.loads((FIXTURES / "mistral" / "config.json").read_text())
PLAN = ["plan", "--kv-budget-gib", "1"]
MIMO = ["--preset", "mimo-v2-flash"]
SIM = ["simulate", "--preset", "tiny-hybrid", "--kv-budget-gib", "0.01", "--workload", "mixed"]
GEN = ["generate", "--max-tokens", "2"]


def write_config(tmp, name, **changes):
    folder = tmp / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**GOOD_CONFIG, **changes}))
    return folder


def checkpoint(tmp, name, weights: bytes | None = None, index=None):
    """The mistral fixture with its weights replaced (or an index added)."""
    folder = tmp / name
    shutil.copytree(FIXTURES / "mistral", folder)
    if weights is not None:
        (folder / "model.safetensors").write_bytes(weights)
    if index is not None:
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


def retiled(real: bytes, second: str) -> bytes:
    """The safetensors bytes `real` with its second tensor's offsets moved back four bytes into
    the first ("overlap") or its first tensor's start moved on four ("gap")."""
    size = int.from_bytes(real[:8], "little")
    header = json.loads(real[8 : 8 + size])
    names = sorted((v["data_offsets"], k) for k, v in header.items() if k != "__metadata__")
    if second == "overlap":
        begin, end = header[names[1][1]]["data_offsets"]
        header[names[1][1]]["data_offsets"] = [begin - 4, end - 4]
    else:
        begin, end = header[names[0][1]]["data_offsets"]
        header[names[0][1]]["data_offsets"] = [begin + 4, end + 4]
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + real[8 + size :]


def trace(tmp, name, lines):
    path = tmp / f"{name}.jsonl"
    path.write_text("".join(x if isinstance(x, str) else json.dumps(x) + "\n" for x in lines))
    return path


HEADER = dict(
    op="init",
    version=2,
    full_size=64,
    swa_size=32,
    page_size=4,
    mode="hybrid",
    window=7,
    cap_leaf_to_window=True,
    ops=1,
)
FREE = dict(op="free", slots=[4], expect={})


def make(tmp):
    """Files the cases refer to as {name}."""
    real = (FIXTURES / "mistral" / "model.safetensors").read_bytes()
    prompts = {
        "p_string": '"hello"\n',
        "p_number": "42\n",
        "p_null": "null\n",
        "p_ids_string": '{"prompt_ids": "123"}\n',
        "p_floats": '{"prompt_ids": [1.5, 2]}\n',
        "p_bools": '{"prompt_ids": [true, false]}\n',
        "p_negative": '{"prompt_ids": [-1]}\n',
        "p_empty_list": '{"prompt_ids": []}\n',
        "p_two_keys": '{"prompt": "a", "prompt_ids": [1]}\n',
        "p_unknown": '{"text": "a"}\n',
        "p_empty": "",
        "p_not_json": "{nope\n",
        "p_big_id": '{"prompt_ids": [100000]}\n',
    }
    files = {}
    for name, text in prompts.items():
        files[name] = tmp / f"{name}.jsonl"
        files[name].write_text(text)
    files.update(
        cfg_vocab=write_config(tmp, "cfg_vocab", vocab_size=-5),
        cfg_layers=write_config(tmp, "cfg_layers", num_hidden_layers=10**7),
        cfg_heads=write_config(tmp, "cfg_heads", num_attention_heads=0),
        cfg_type=write_config(tmp, "cfg_type", model_type="no_such_model"),
        cfg_window=write_config(tmp, "cfg_window", sliding_window=1),
        cfg_full=write_config(tmp, "cfg_full", model_type="qwen3", use_sliding_window=False),
        ck_corrupt=checkpoint(tmp, "ck_corrupt", b"\x00garbage" * 10),
        ck_truncated=checkpoint(tmp, "ck_truncated", real[: len(real) // 2]),
        ck_empty=checkpoint(tmp, "ck_empty", b""),
        ck_no_map=checkpoint(tmp, "ck_no_map", index={"metadata": {}}),
        ck_overlap=checkpoint(tmp, "ck_overlap", retiled(real, "overlap")),
        ck_gap=checkpoint(tmp, "ck_gap", retiled(real, "gap")),
        ck_escape=checkpoint(tmp, "ck_escape", index={"weight_map": {"a": "../x.safetensors"}}),
        ck_absolute=checkpoint(tmp, "ck_absolute", index={"weight_map": {"a": "/etc/passwd"}}),
        no_config=tmp / "no_config",
        out_full=tmp / "out_full",
        a_dir=tmp / "a_dir",
        t_empty=trace(tmp, "t_empty", []),
        t_not_json=trace(tmp, "t_not_json", ["{nope\n"]),
        t_no_header=trace(tmp, "t_no_header", [FREE]),
        t_version=trace(tmp, "t_version", [dict(HEADER, version=1), FREE]),
        t_truncated=trace(tmp, "t_truncated", [dict(HEADER, ops=3), FREE]),
        t_unknown=trace(tmp, "t_unknown", [HEADER, dict(FREE, op="format_disk")]),
        t_huge=trace(
            tmp,
            "t_huge",
            [HEADER, dict(op="alloc_decode", seq_lens=[10**9], last_loc=[-1], expect={})],
        ),
        t_strings=trace(tmp, "t_strings", [HEADER, dict(FREE, slots=["4"])]),
        t_extra=trace(tmp, "t_extra", [HEADER, dict(FREE, evil=1)]),
        t_no_expect=trace(tmp, "t_no_expect", [HEADER, dict(op="free", slots=[4])]),
        t_sizes=trace(tmp, "t_sizes", [dict(HEADER, full_size=63), FREE]),
        t_bool=trace(tmp, "t_bool", [HEADER, dict(FREE, slots=[True])]),
        t_handle=trace(tmp, "t_handle", [HEADER, dict(op="unlock", handle=7, expect={})]),
    )
    files["no_config"].mkdir()
    files["out_full"].mkdir()
    (files["out_full"] / "keep.txt").write_text("precious")
    files["a_dir"].mkdir()
    for name in ("png_dir", "npy_dir"):
        files[name] = tmp / f"{name}.{name[:3]}"
        files[name].mkdir()
    return files


CASES = [
    # plan
    (
        PLAN + MIMO + ["--swa-full-tokens-ratio", "0"],
        "--swa-full-tokens-ratio: must be a number in (0.0, 1.0], got 0",
    ),
    (PLAN + MIMO + ["--swa-full-tokens-ratio", "1.5"], "got 1.5"),
    (PLAN + MIMO + ["--swa-full-tokens-ratio", "nan"], "got nan"),
    (PLAN + MIMO + ["--swa-full-tokens-ratio", "abc"], "must be a number, got 'abc'"),
    (["plan", *MIMO, "--kv-budget-gib", "0"], "--kv-budget-gib"),
    (["plan", *MIMO, "--kv-budget-gib", "inf"], "got inf"),
    (PLAN + MIMO + ["--page-size", "0"], "--page-size: must be an integer in [1, 65536], got 0"),
    (PLAN + MIMO + ["--page-size", "1.5"], "must be an integer, got '1.5'"),
    (PLAN + MIMO + ["--dtype", "fp4"], "invalid choice: 'fp4'"),
    (PLAN + MIMO + ["--eviction-interval", "-500"], "--eviction-interval: must be an integer"),
    (PLAN + MIMO + ["--avg-seq-len", "0"], "--avg-seq-len"),
    (PLAN + ["--preset", "no-such"], "no-such"),
    (PLAN + MIMO + ["--hf-config", "{cfg_vocab}"], "not both"),
    (PLAN, "give one of --preset NAME or --hf-config PATH"),
    (PLAN + ["--hf-config", "{no_config}"], "no config file"),
    (PLAN + ["--hf-config", "{p_not_json}"], "not valid JSON"),
    (PLAN + ["--hf-config", "{cfg_vocab}"], "'vocab_size' must be an integer in [1, 16777216]"),
    (PLAN + ["--hf-config", "{cfg_layers}"], "'num_hidden_layers' must be an integer in [1, 4096]"),
    (PLAN + ["--hf-config", "{cfg_heads}"], "'num_attention_heads'"),
    (PLAN + ["--hf-config", "{cfg_type}"], "no_such_model"),
    (PLAN + ["--hf-config", "{cfg_window}"], "'sliding_window' must be >= 2"),
    # simulate
    (SIM + ["--requests", "0"], "--requests: must be an integer in [1, 1000000], got 0"),
    (SIM + ["--requests", "-1"], "got -1"),
    (SIM + ["--seed", "-1"], "--seed"),
    (SIM[:-1] + ["foo"], "or a JSON-lines file, got 'foo'"),
    (SIM + ["--plot", "{png_dir}"], "is a folder"),
    (SIM + ["--plot", "{a_dir}"], "must end in .png"),
    (SIM + ["--plot", "{no_config}/missing/x.png"], "does not exist"),
    (SIM + ["--swa-full-tokens-ratio", "0.00001"], "SWA pool"),
    # generate
    (GEN + ["--prompt-ids", ""], "must be comma-separated token ids, got ''"),
    (GEN + ["--prompt-ids", "1,,2"], "got '1,,2'"),
    (GEN + ["--prompt-ids", "-1"], "token ids must be >= 0, got -1"),
    (GEN + ["--prompt-ids", "1.5"], "got '1.5'"),
    (GEN + ["--prompt-ids", "1000"], "token id 1000 is outside the vocabulary [0, 256)"),
    (GEN + ["--prompt", ""], "--prompt is empty"),
    (GEN + ["--prompt", "a", "--prompt-ids", "1"], "give one of --prompt"),
    (GEN + ["--seed", "-1"], "--seed/--random-seed: must be an integer in [0, 4294967295], got -1"),
    (GEN + ["--seed", "4294967296"], "got 4294967296"),
    (GEN + ["--top-p", "0"], "--top-p"),
    (GEN + ["--top-p", "2"], "--top-p"),
    (GEN + ["--temperature", "-1"], "--temperature"),
    (GEN + ["--temperature", "nan"], "--temperature"),
    (["generate", "--max-tokens", "0"], "--max-tokens"),
    (
        GEN + ["--model", "{no_config}/nowhere"],
        "--model must be 'tiny', a checkpoint folder or a hub id",
    ),
    (GEN + ["--attention", "cuda"], "invalid choice: 'cuda'"),
    (GEN + ["--prompts-file", "{p_string}"], "p_string.jsonl:1: each line must be an object"),
    (GEN + ["--prompts-file", "{p_number}"], "each line must be an object"),
    (GEN + ["--prompts-file", "{p_null}"], "each line must be an object"),
    (GEN + ["--prompts-file", "{p_ids_string}"], "'prompt_ids' must be a non-empty list"),
    (GEN + ["--prompts-file", "{p_floats}"], "'prompt_ids' must be a non-empty list"),
    (GEN + ["--prompts-file", "{p_bools}"], "'prompt_ids' must be a non-empty list"),
    (GEN + ["--prompts-file", "{p_negative}"], "integers >= 0"),
    (GEN + ["--prompts-file", "{p_empty_list}"], "non-empty list"),
    (GEN + ["--prompts-file", "{p_two_keys}"], "with one key"),
    (GEN + ["--prompts-file", "{p_unknown}"], "with one key"),
    (GEN + ["--prompts-file", "{p_empty}"], "holds no prompt"),
    (GEN + ["--prompts-file", "{p_not_json}"], "p_not_json.jsonl:1: not JSON"),
    (GEN + ["--prompts-file", "{p_big_id}"], "outside the vocabulary"),
    (GEN + ["--prompts-file", "{no_config}/none.jsonl"], "cannot read the prompts file"),
    (GEN + ["--model", "{ck_corrupt}", "--prompt-ids", "1"], "ck_corrupt/model.safetensors"),
    (GEN + ["--model", "{ck_truncated}", "--prompt-ids", "1"], "cannot read"),
    (GEN + ["--model", "{ck_empty}", "--prompt-ids", "1"], "cannot read"),
    (GEN + ["--model", "{ck_no_map}", "--prompt-ids", "1"], "'weight_map'"),
    (GEN + ["--model", "{ck_escape}", "--prompt-ids", "1"], "leaves the checkpoint folder"),
    (GEN + ["--model", "{ck_absolute}", "--prompt-ids", "1"], "leaves the checkpoint folder"),
    (GEN + ["--model", "{ck_overlap}", "--prompt-ids", "1"], "overlaps tensor"),
    (GEN + ["--model", "{ck_gap}", "--prompt-ids", "1"], "4 bytes at the start belong to no"),
    (GEN + ["--host-cache-gib", "1000000"], "more than this machine's memory"),
    # logits
    (["logits", "--prompt-ids", "1", "--out", "{a_dir}/x"], "must end in .npy"),
    (["logits", "--prompt-ids", "1", "--out", "{npy_dir}"], "is a folder"),
    (["logits", "--prompt-ids", "1"], "--out"),
    # convert
    (["convert", "{no_config}/nowhere", "{a_dir}/new"], "no config.json"),
    (["convert", "{no_config}", "{a_dir}/new"], "no config.json"),
    (["convert", "{ck_corrupt}", "{a_dir}/new"], "cannot read"),
    (["convert", str(FIXTURES / "mistral"), "{out_full}"], "is not empty (use --force"),
    (["convert", str(FIXTURES / "mistral"), "{no_config}/a/b"], "does not exist"),
    # record
    (["record", "--requests", "0", "--out", "{a_dir}/t.jsonl"], "--requests"),
    (["record", "--requests", "-1", "--out", "{a_dir}/t.jsonl"], "got -1"),
    (["record", "--out", "{a_dir}/t.json"], "must end in .jsonl"),
    (["record", "--hf-config", "{cfg_full}", "--out", "{a_dir}/t.jsonl"], "no sliding layers"),
    # a host tier
    ([*SIM, "--host-cache-gib", "-1"], "--host-cache-gib"),
    ([*PLAN, *MIMO, "--host-cache-gib", "1", "--disable-hybrid-swa-memory"], "has one pool"),
    ([*SIM, "--host-cache-gib", "0.01", "--cache-policy", "sglang-0.5.23"], "has no host tier"),
    ([*GEN, "--host-cache-gib", "1", "--disable-hybrid-swa-memory"], "one pool"),
    # replay
    (["replay", "{no_config}/none.jsonl"], "cannot read the trace"),
    (["replay", "{t_empty}"], "the trace is empty"),
    (["replay", "{t_not_json}"], "t_not_json.jsonl:1: not JSON"),
    (["replay", "{t_no_header}"], "the first line must be the 'init' header"),
    (["replay", "{t_version}"], "trace format version 1"),
    (["replay", "{t_truncated}"], "announces 3 operations, the file holds 1"),
    (["replay", "{t_unknown}"], "unknown operation 'format_disk'"),
    (["replay", "{t_huge}"], "seq_lens: every entry must be an integer"),
    (["replay", "{t_strings}"], "slots: every entry must be an integer"),
    (["replay", "{t_extra}"], "takes no field 'evil'"),
    (["replay", "{t_no_expect}"], "needs its 'expect' object"),
    (["replay", "{t_sizes}"], "full_size must be a multiple of page_size 4"),
    (["replay", "{t_bool}"], "slots: every entry must be an integer"),
    (["replay", "{t_handle}"], "names lock handle 7, which no earlier lock"),
]


def snapshot(folder):
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
    }


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad")
    return tmp, make(tmp)


def test_there_are_many_cases():
    assert len(CASES) >= 60
    assert {c[0][0] for c in CASES} == {
        "plan",
        "simulate",
        "generate",
        "logits",
        "convert",
        "record",
        "replay",
    }


@pytest.mark.parametrize("argv, needle", CASES, ids=[f"{i}-{c[0][0]}" for i, c in enumerate(CASES)])
def test_bad_input_is_one_line_exit_2_and_changes_nothing(cli, files, argv, needle):
    tmp, named = files
    argv = [a.format(**named) for a in argv]
    before = snapshot(tmp)
    code, out, err = cli(*argv)
    assert code == 2, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert needle in lines[0], lines[0]
    assert snapshot(tmp) == before
