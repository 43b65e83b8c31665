"""Write tests/fixtures/bpe_files/: a byte-level BPE tokenizer published the older way, as
`vocab.json` + `merges.txt` with no tokenizer.json (GPT-2's layout), and `expected.json`: the ids
and texts transformers' own tokenizer gives for a few texts. Run in an environment with
transformers (5.24) and tokenizers, e.g. the SGLang peer venv:

    .venvs/sglang/bin/python tools/make_bpe_files_fixture.py
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from tokenizers import ByteLevelBPETokenizer
from transformers import AutoTokenizer

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "bpe_files"
CORPUS = [
    "def fibonacci(n): return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "The quick brown fox jumps over the lazy dog. Über café naïve 漢字 😀",
    "import numpy as np\nx = np.arange(10)\nprint(x * 2)",
] * 20
TEXTS = [
    "def fibonacci(n):",
    " leading space and  two spaces",
    "Über café 漢字 😀 new\nlines\ttabs",
    "<|endoftext|> is special",
]


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS, vocab_size=400, special_tokens=["<|endoftext|>"])
    with tempfile.TemporaryDirectory() as tmp:
        bpe.save_model(tmp)
        for name in ("vocab.json", "merges.txt"):
            (OUT / name).write_text((Path(tmp) / name).read_text())
    config = {
        "tokenizer_class": "GPT2Tokenizer",
        "add_prefix_space": False,
        "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>",
    }
    (OUT / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")
    tok = AutoTokenizer.from_pretrained(OUT)
    cases = []
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        # Decoded as vLLM's outputs are (special tokens skipped), and with them.
        skipped = tok.decode(ids, skip_special_tokens=True)
        cases.append(dict(text=text, ids=ids, decoded=skipped, with_specials=tok.decode(ids)))
    (OUT / "expected.json").write_text(json.dumps(cases, indent=1, ensure_ascii=False) + "\n")
    print(f"{OUT}: {len(cases)} cases, {type(tok).__name__}")


if __name__ == "__main__":
    main()
