"""Tokenizers as published: a byte-level BPE given only as vocab.json + merges.txt, and
SentencePiece's tokenizer.model alone, give the ids and text transformers' own tokenizer gives
(tests/fixtures/bpe_files and tests/fixtures/sentencepiece, written by
tools/make_bpe_files_fixture.py and tools/make_sentencepiece_fixtures.py with transformers
5.24); a tokenizer swajax cannot read is a clear error naming the way out, not ids from
nowhere."""

import json
import shutil

import numpy as np
import pytest
from helpers import FIXTURES

from swajax.tokenizer import Tokenizer

BPE = FIXTURES / "bpe_files"
CASES = json.loads((BPE / "expected.json").read_text())


@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_vocab_and_merges_encode_and_decode_as_transformers_does(case):
    tok = Tokenizer(BPE)
    assert tok.encode_rendered(case["text"]) == case["ids"]
    assert tok.decode(case["ids"]) == case["decoded"]  # special tokens skipped, as vLLM's outputs
    assert tok.hf.decode(case["ids"], skip_special_tokens=False) == case["with_specials"]
    decoder, text = tok.incremental(), ""
    for token in case["ids"]:
        text += decoder.push(token)
    assert text == case["decoded"]  # streamed text too


def test_the_fixture_exercises_merges_and_a_special_token():
    """The control: merged tokens (ids past the 256 bytes) and the special token as one id."""
    ids = [i for c in CASES for i in c["ids"]]
    vocab = json.loads((BPE / "vocab.json").read_text())
    assert any(i > 256 for i in ids) and vocab["<|endoftext|>"] in CASES[-1]["ids"]


SPM = FIXTURES / "sentencepiece"
SPM_FOLDERS = sorted(p.name for p in SPM.iterdir() if p.is_dir())


@pytest.mark.parametrize("name", SPM_FOLDERS)
def test_a_sentencepiece_model_encodes_and_decodes_as_transformers_does(name, tmp_path):
    """Each text with and without the special tokens the config adds, and the text of its ids
    (special tokens skipped, as vLLM's outputs), whole and streamed; the folder copied, so
    nothing but tokenizer.model and tokenizer_config.json is read."""
    folder = tmp_path / name
    shutil.copytree(SPM / name, folder)
    (folder / "expected.json").unlink()
    expected = json.loads((SPM / name / "expected.json").read_text())
    tok = Tokenizer(folder)
    assert tok.hf.get_vocab_size() == expected["vocab"]
    for case in expected["cases"]:
        assert tok.encode(case["text"]) == case["ids"], case["text"]
        assert tok.encode_rendered(case["text"]) == case["plain_ids"], case["text"]
        assert tok.decode(case["ids"]) == case["decoded"], case["text"]
        decoder, text = tok.incremental(), ""
        for token in case["ids"]:
            text += decoder.push(token)
        assert text == case["decoded"], case["text"]


@pytest.mark.parametrize("name", ["bpe", "unigram"])
def test_the_generic_route_encodes_as_sentencepiece_itself(name):
    """A model whose class has no pipeline of its own follows the model file, as the
    `sentencepiece` library encodes it (texts without added tokens, which it does not split)."""
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_file=str(SPM / name / "tokenizer.model"))
    tok = Tokenizer(SPM / name)
    texts = [c["text"] for c in json.loads((SPM / name / "expected.json").read_text())["cases"]]
    plain = [t for t in texts if "<" not in t]
    assert len(plain) > 40
    for text in plain:
        assert tok.encode_rendered(text) == processor.encode(text), text


def test_the_sentencepiece_fixtures_differ_where_the_pipelines_do():
    """The control: Llama's two prefix schemes, Gemma's pipeline and the file-driven route each
    tokenize some text differently, each folder has merged pieces, byte fallback and a special
    token matched in text."""
    cases = {n: json.loads((SPM / n / "expected.json").read_text())["cases"] for n in SPM_FOLDERS}
    assert set(SPM_FOLDERS) == {"bpe", "gemma", "llama", "llama-legacy", "unigram"}
    for a in SPM_FOLDERS:
        for b in SPM_FOLDERS:
            if a < b:
                assert any(x["plain_ids"] != y["plain_ids"] for x, y in zip(cases[a], cases[b]))
    for name, rows in cases.items():
        ids = [i for c in rows for i in c["plain_ids"]]
        assert max(ids) > 100 and len(set(ids)) > 50, name
        emoji = next(c for c in rows if "😀" in c["text"])
        assert "😀" in emoji["decoded"] or name == "unigram", name  # unigram has no byte fallback
    assert cases["llama"][0]["ids"][0] == 1 and cases["llama-legacy"][0]["ids"][0] != 1


def test_an_unreadable_tokenizer_is_a_clear_error(tmp_path):
    folder = tmp_path / "spm"
    folder.mkdir()
    (folder / "tokenizer.model").write_bytes(b"\xff\x00not a model")
    with pytest.raises(ValueError, match="not a SentencePiece model"):
        Tokenizer(folder).encode("hello")
    shutil.copy(SPM / "llama" / "tokenizer.model", folder / "tokenizer.model")
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "T5Tokenizer"}))
    tok = Tokenizer(folder)  # token ids still work; text says why not
    assert tok.decode([5, 6]) is None
    with pytest.raises(ValueError, match="'T5Tokenizer'.*save_pretrained"):
        tok.encode("hello")
    (folder / "tokenizer.model").unlink()
    shutil.copy(BPE / "vocab.json", folder / "vocab.json")  # merges.txt missing: not a BPE
    with pytest.raises(ValueError, match="no tokenizer swajax reads"):
        Tokenizer(folder).encode("hello")


def _gemma3_with_sentencepiece(tmp_path):
    """A small random-weight Gemma 3 checkpoint published the older way: tokenizer.model and
    tokenizer_config.json only, with Gemma 3's published chat template."""
    from safetensors.numpy import load_file, save_file

    folder = tmp_path / "gemma3-spm"
    shutil.copytree(SPM / "gemma", folder)
    (folder / "expected.json").unlink()
    shutil.copy(FIXTURES / "published_templates" / "gemma-3.jinja", folder / "chat_template.jinja")
    config = json.loads((FIXTURES / "gemma3" / "config.json").read_text())
    vocab = json.loads((SPM / "gemma" / "expected.json").read_text())["vocab"]
    config.update(vocab_size=vocab, pad_token_id=0, eos_token_id=1, bos_token_id=2)
    (folder / "config.json").write_text(json.dumps(config))
    weights = load_file(FIXTURES / "gemma3" / "model.safetensors")
    width = weights["model.embed_tokens.weight"].shape[1]
    rng = np.random.default_rng(0)
    weights["model.embed_tokens.weight"] = (rng.normal(size=(vocab, width)) * 0.02).astype(
        np.float32
    )
    save_file(weights, folder / "model.safetensors")
    return folder


def test_a_checkpoint_with_only_tokenizer_model_chats_as_transformers_renders(tmp_path):
    """LLM.chat on it sends the model the text and ids transformers' apply_chat_template gives
    (Gemma 3's template over Gemma's tokenizer.model); its output comes back as text; and a
    text prompt to generate() gets transformers' ids, its beginning-of-text token included."""
    from swajax import LLM, SamplingParams

    folder = _gemma3_with_sentencepiece(tmp_path)
    chat = json.loads((SPM / "gemma" / "expected.json").read_text())["chat"]
    llm = LLM(str(folder), kv_budget_gib=0.01, page_size=4)
    (out,) = llm.chat(chat["messages"], SamplingParams(max_tokens=4, temperature=0.0))
    assert out.prompt == chat["text"]
    assert list(out.prompt_token_ids) == chat["ids"]
    ids = list(out.outputs[0].token_ids)
    assert out.outputs[0].text == llm.get_tokenizer().decode(ids, skip_special_tokens=True)
    plain = json.loads((SPM / "gemma" / "expected.json").read_text())["cases"][0]
    (out,) = llm.generate(plain["text"], SamplingParams(max_tokens=1), use_tqdm=False)
    assert list(out.prompt_token_ids) == plain["ids"]


def test_a_sentencepiece_model_without_its_package_keeps_ids_and_names_the_extra(monkeypatch):
    """Without the sentencepiece package the folder still loads for token ids; text is an error
    naming the extra that brings it."""
    import sys

    monkeypatch.setitem(sys.modules, "sentencepiece", None)  # import fails as if not installed
    tok = Tokenizer(SPM / "llama")
    assert tok.hf is None and tok.decode([5, 6]) is None
    with pytest.raises(ValueError, match=r"sentencepiece.*swajax\[hf\].*--prompt-ids"):
        tok.encode("hello")
