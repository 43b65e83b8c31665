"""The ecosystem's language: a script written the way vLLM's quickstart writes one runs with only
its import changed; SGLang's launch flags (and vLLM's spellings) reach the engine; a hub id
resolves from a local Hugging Face cache with nothing downloaded; a checkpoint's own
generation_config.json sets the sampling defaults; streamed text is decoded incrementally and
ends equal to the whole decode; the Grafana dashboard reads only metrics the server exports."""

import json
import os
import re
import runpy
import shutil
import subprocess
import sys

import numpy as np
import pytest
from helpers import FIXTURES, ROOT

import swajax
from swajax import SamplingParams

# vLLM's quickstart (docs: "Offline Batched Inference"), with `vllm` replaced by `swajax` and the
# model by the embedded demo; then its chat example, on a checkpoint with a template.
QUICKSTART = """
from swajax import LLM, SamplingParams

prompts = [
    "Hello, my name is",
    "The president of the United States is",
    "The capital of France is",
    "The future of AI is",
]
sampling_params = SamplingParams(temperature=0.8, top_p=0.95)
llm = LLM(model=MODEL)
outputs = llm.generate(prompts, sampling_params)
for output in outputs:
    prompt = output.prompt
    generated_text = output.outputs[0].text
    print(f"Prompt: {prompt!r}, Generated text: {generated_text!r}")

conversation = [
    {"role": "system", "content": "You are a helpful assistant"},
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hello! How can I assist you today?"},
    {"role": "user", "content": "Write an essay about the importance of higher education."},
]
outputs = llm.chat(conversation, sampling_params, use_tqdm=False)
print(outputs[0].outputs[0].text is not None, outputs[0].outputs[0].finish_reason)
"""


def test_a_vllm_quickstart_script_runs_with_only_the_import_changed(tmp_path, capsys):
    """The script runs as `python quickstart.py` would run it (as `__main__`), in this process
    (so the run's compile cache serves it)."""
    from helpers.server import demo_folder

    model = demo_folder(tmp_path / "demo")
    script = tmp_path / "quickstart.py"
    script.write_text(f"MODEL = {str(model)!r}\n" + QUICKSTART)
    runpy.run_path(str(script), run_name="__main__")
    lines = capsys.readouterr().out.strip().splitlines()
    assert sum(line.startswith("Prompt: 'Hello, my name is'") for line in lines) == 1
    assert lines[-1] in ("True length", "True stop")


def test_unknown_and_old_settings_name_the_public_ones():
    with pytest.raises(swajax.InputError, match=r"'max_context' \(renamed: max_model_len\)"):
        swajax.LLM("tiny", max_context=64)
    with pytest.raises(swajax.InputError, match="valid: .*gpu_memory_utilization"):
        swajax.LLM("tiny", max_num_seq=4)  # (vLLM's max_num_seqs is max_running_requests)


def test_vllm_and_sglang_settings_reach_the_engine():
    llm = swajax.LLM(
        "tiny",
        max_model_len=96,
        enable_prefix_caching=False,
        swa_full_tokens_ratio=0.25,
        page_size=8,
        chunked_prefill_size=32,
        max_running_requests=3,
        gpu_memory_utilization=0.05,
        seed=7,
    )
    options, sizes = llm.engine.options, llm.engine.sizes
    assert (options.max_context, options.chunk_size, options.max_running) == (96, 32, 3)
    assert not options.prefix_cache and options.seed == 7 and sizes.page_size == 8
    assert sizes.swa_tokens / sizes.full_tokens == pytest.approx(0.25, rel=0.05)
    from swajax.api.engine_spec import device_memory_bytes

    kv = sizes.full_tokens  # the pools got what the weights left of 5% of the host's memory
    assert kv > 0 and device_memory_bytes() * 0.05 > 2**20


SGLANG = [
    "--swa-full-tokens-ratio",
    "0.25",
    "--page-size",
    "8",
    "--chunked-prefill-size",
    "32",
    "--max-running-requests",
    "3",
    "--context-length",
    "96",
    "--mem-fraction-static",
    "0.4",
    "--tp-size",
    "1",
    "--disable-radix-cache",
    "--kv-cache-dtype",
    "bf16",
]
VLLM = ["--max-model-len", "96", "--tensor-parallel-size", "1", "--gpu-memory-utilization", "0.4"]


@pytest.mark.parametrize("command", ["generate", "serve", "logits"])
def test_an_sglang_launch_line_reaches_the_engine(command):
    from swajax.cli.generate import engine_fields
    from swajax.cli.main import build_parser

    extra = ["--out", "x.npy"] if command == "logits" else []
    fields = engine_fields(build_parser().parse_args([command, *SGLANG, *extra]))
    assert fields["ratio"] == 0.25 and fields["page_size"] == 8 and fields["chunk_size"] == 32
    assert fields["max_running"] == 3 and fields["max_context"] == 96
    assert fields["mem_fraction"] == 0.4 and fields["tensor_parallel"] == 1
    assert fields["prefix_cache"] is False and fields["kv_dtype"] == "bf16"
    vllm = engine_fields(build_parser().parse_args([command, *VLLM, *extra]))
    assert (vllm["max_context"], vllm["tensor_parallel"], vllm["mem_fraction"]) == (96, 1, 0.4)
    hybrid = build_parser().parse_args([command, "--disable-hybrid-swa-memory", *extra])
    assert engine_fields(hybrid)["hybrid_memory"] is False


def test_global_flags_work_after_the_command(cli):
    argv = ("generate", "--prompt-ids", "1,2", "--max-tokens", "1")
    _, _, after = cli(*argv, "-v")
    _, _, before = cli("-v", *argv)
    assert "swajax: INFO: loading" in after and "swajax: INFO: loading" in before


def fake_hub_cache(root, repo: str, source) -> str:
    """The huggingface_hub cache layout for `repo` holding `source`'s files: blobs named by
    hash, a snapshot of links to them, and refs/main naming the snapshot."""
    folder = root / f"models--{repo.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = folder / "snapshots" / commit
    (folder / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for i, f in enumerate(sorted(source.iterdir())):
        blob = folder / "blobs" / f"{i:040x}"
        shutil.copy(f, blob)
        (snapshot / f.name).symlink_to(os.path.relpath(blob, snapshot))
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(commit)
    return commit


def test_a_hub_id_resolves_from_the_local_cache_offline(tmp_path, monkeypatch, cli):
    commit = fake_hub_cache(tmp_path / "hub", "swajax-test/gpt-oss-tiny", FIXTURES / "gpt_oss")
    env = dict(os.environ, HF_HUB_CACHE=str(tmp_path / "hub"), HF_HUB_OFFLINE="1")
    case = json.loads((FIXTURES / "gpt_oss" / "greedy.json").read_text())
    base = [
        sys.executable,
        "-m",
        "swajax",
        "generate",
        "--prompt-ids",
        ",".join(map(str, case["prompt"])),
        "--max-tokens",
        "8",
        "--json",
        "--ignore-eos",
    ]
    argv = [*base, "--model", "swajax-test/gpt-oss-tiny"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[0])["tokens"] == case["greedy"]
    # The same command at a pinned revision, and an id not in the cache, in this process (the
    # folder `HF_HUB_CACHE` named is what huggingface_hub resolved it to at import).
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, out, err = cli(*base[3:], "--model", "swajax-test/gpt-oss-tiny", "--revision", commit)
    assert code == 0, err[-2000:]
    assert json.loads(out.splitlines()[0])["tokens"] == case["greedy"]
    code, _, err = cli(*base[3:], "--model", "swajax-test/not-cached")
    line = err.strip().splitlines()[-1]
    assert code == 2 and "'swajax-test/not-cached'" in line
    assert "not in the local Hugging Face cache" in line and "downloads nothing" in line
    # The command the installed huggingface_hub ships (`hf`; 2.x has no `huggingface-cli`).
    assert "`hf download swajax-test/not-cached`" in line


@pytest.fixture(scope="module")
def with_generation_config(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gc") / "qwen3"
    shutil.copytree(FIXTURES / "qwen3", folder)
    (folder / "generation_config.json").write_text(
        json.dumps({"temperature": 0.0, "top_k": 5, "eos_token_id": 2})
    )
    return folder


def test_the_checkpoints_sampling_defaults_apply_and_yield(with_generation_config):
    case = json.loads((FIXTURES / "qwen3" / "greedy.json").read_text())
    llm = swajax.LLM(str(with_generation_config), max_model_len=64)
    assert llm.engine.sampling_defaults == {"temperature": 0.0, "top_k": 5}
    unset = SamplingParams(max_tokens=8, ignore_eos=True)
    (out,) = llm.generate([case["prompt"]], unset)[0].outputs
    assert out.token_ids == case["greedy"]  # the file's temperature 0: greedy
    req = list(llm.engine.requests.values())[-1]
    assert (req.params.temperature, req.params.top_k, req.params.top_p) == (0.0, 5, 1.0)
    hot = SamplingParams(max_tokens=8, ignore_eos=True, temperature=1.0, top_k=0, seed=5)
    (mine,) = llm.generate([case["prompt"]], hot)[0].outputs
    vllm = swajax.LLM(str(with_generation_config), max_model_len=64, generation_config="vllm")
    assert vllm.engine.sampling_defaults == {}
    (plain,) = vllm.generate(
        [case["prompt"]], SamplingParams(max_tokens=8, ignore_eos=True, seed=5)
    )[0].outputs
    assert plain.token_ids == mine.token_ids  # neutral defaults: temperature 1, nothing cut


def byte_level_tokenizer():
    from helpers.server import _byte_chars
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.BPE({c: b for b, c in enumerate(_byte_chars())}, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def byte_fallback_tokenizer():
    """A sentencepiece-style tokenizer: whole pieces for some words, <0xNN> byte tokens for
    everything else (multi-byte characters come out one byte token at a time)."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for word in ("▁the", "▁window", "▁slides", "▁é", "t", "h", "e", "▁"):
        vocab[word] = len(vocab)
    tok = Tokenizer(models.BPE(vocab, [], unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    tok.add_special_tokens(["<s>", "</s>"])
    return tok


@pytest.mark.parametrize("kind", ["bytes", "byte-level BPE", "byte fallback"])
def test_streamed_text_is_incremental_and_ends_equal_to_the_whole_decode(kind, tmp_path):
    from swajax.tokenizer import Tokenizer

    if kind == "bytes":
        tokenizer, vocab = Tokenizer(None), 256
    else:
        hf = byte_level_tokenizer() if kind == "byte-level BPE" else byte_fallback_tokenizer()
        (tmp_path / "m").mkdir()
        hf.save(str(tmp_path / "m" / "tokenizer.json"))
        tokenizer, vocab = Tokenizer(tmp_path / "m"), hf.get_vocab_size()
    rng = np.random.default_rng(0)
    texts = ["the window slides é 窗口 🪟 ok", "naïve café — 滑动窗口"]
    for text in texts:
        ids = tokenizer.encode(text)
        for case in (ids, ids[:-1], ids[:-2]):  # whole, and cut inside a character
            decoder = tokenizer.incremental()
            pieces = [decoder.push(t) for t in case]
            assert "\ufffd" not in "".join(pieces)  # no replacement character mid-character
            # As a stream hands them out, token by token: the last event completes the text
            # to the whole decode, which extends what was shown (a byte-fallback decoder turns
            # a whole run of bytes cut mid-character into U+FFFD: there the stream keeps the
            # characters it showed, and never takes text back).
            whole = tokenizer.decode(case)
            expected = whole if whole.startswith("".join(pieces)) else "".join(pieces)
            assert "".join(streamed(tokenizer, case)) == expected
            if case is ids:
                assert expected == whole == "".join(pieces)
    # Random ids (bytes that never form text): the decoder goes on and gives only text.
    decoder = tokenizer.incremental()
    assert all(isinstance(decoder.push(int(t)), str) for t in rng.integers(0, vocab, 200))


def streamed(tokenizer, ids: list[int]) -> list[str]:
    """The texts a SampleStream's events carry when `ids` arrive one step at a time."""
    from types import SimpleNamespace

    from swajax.api.sample_stream import SampleStream
    from swajax.api.stop_strings import StopWatch

    x = SampleStream(0, 0, 0, StopWatch(()), decoder=tokenizer.incremental())
    req = SimpleNamespace(output=[], logprobs=[], top_logprobs=[], done=False, finish_reason=None)
    texts = []
    for i, t in enumerate(ids):
        req.output.append(t)
        req.logprobs.append(0.0)
        if i == len(ids) - 1:
            req.done, req.finish_reason = True, "length"
        texts += [e.text for e in x.new_events(req, tokenizer.decode)]
    return texts


def test_streamed_events_join_to_the_generated_text():
    llm = swajax.LLM("tiny")
    params = SamplingParams(max_tokens=60, temperature=0.9, seed=3, ignore_eos=True)
    (expected,) = llm.generate("def windows(x):", params)[0].outputs
    streamed = "".join(e.text for e in llm.stream("def windows(x):", params))
    assert streamed == expected.text


def test_the_grafana_dashboard_reads_only_exported_metrics():
    from swajax.server.metrics import EVENTS, PREFIX, STATE

    dashboard = json.loads((ROOT / "examples" / "grafana_dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"swajax:[a-z0-9_]+", e)}
    exported = set()
    for name, kind in {**STATE, **EVENTS}.items():
        suffixes = {
            "counter": ["_total"],
            "gauge": [""],
            "histogram": ["_bucket", "_sum", "_count"],
        }
        exported |= {PREFIX + name + s for s in suffixes[kind]}
    assert used and used <= exported, used - exported
    assert {PREFIX + n for n in ("num_requests_running",)} <= used
    assert any("time_to_first_token_seconds_bucket" in e for e in exprs)


def test_a_cache_snapshot_is_served_under_its_hub_id(tmp_path):
    from swajax.cli.serve import served_name

    commit = fake_hub_cache(tmp_path / "hub", "org/model-7b", FIXTURES / "qwen3")
    snapshot = tmp_path / "hub" / "models--org--model-7b" / "snapshots" / commit
    assert served_name(str(snapshot)) == "org/model-7b"
    assert served_name(str(FIXTURES / "qwen3")) == "qwen3"
    assert served_name("org/model-7b") == "org/model-7b" and served_name("tiny") == "tiny"


def test_settings_that_exceed_the_model_or_do_nothing_are_said(caplog):
    """A context past the model's positions, and a pool ratio with one pool, are warned about
    by name (SGLang's and vLLM's launch lines carry both), never taken in silence."""
    import logging

    with caplog.at_level(logging.WARNING):
        swajax.LLM("tiny", max_model_len=8192, kv_budget_gib=0.01)
    assert "context limit 8192 is longer than the model's positions" in caplog.text
    assert "max_position_embeddings 4096" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        swajax.LLM(
            "tiny", swa_full_tokens_ratio=0.3, disable_hybrid_swa_memory=True, kv_budget_gib=0.01
        )
    assert "swa_full_tokens_ratio 0.3 has no effect: the hybrid SWA memory is off" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        swajax.LLM("tiny", max_model_len=1024, swa_full_tokens_ratio=0.3, kv_budget_gib=0.01)
    assert "no effect" not in caplog.text and "longer than" not in caplog.text
