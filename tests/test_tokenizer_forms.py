"""Tokenizers as published: a byte-level BPE given only as vocab.json + merges.txt gives the ids
and text transformers' own tokenizer gives (tests/fixtures/bpe_files, written by
tools/make_bpe_files_fixture.py with transformers 5.24); a SentencePiece tokenizer.model alone
is a clear error naming the way out, not ids from nowhere."""

import json
import shutil

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


def test_a_sentencepiece_model_alone_is_a_clear_error(tmp_path):
    folder = tmp_path / "spm"
    folder.mkdir()
    (folder / "tokenizer.model").write_bytes(b"\x0a\x00")  # what it holds is not read
    with pytest.raises(ValueError, match="SentencePiece's tokenizer.model.*save_pretrained"):
        Tokenizer(folder).encode("hello")
    shutil.copy(BPE / "vocab.json", folder / "vocab.json")  # merges.txt missing: not a BPE
    with pytest.raises(ValueError, match="SentencePiece"):
        Tokenizer(folder).encode("hello")
