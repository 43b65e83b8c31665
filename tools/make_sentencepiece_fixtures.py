"""Write tests/fixtures/sentencepiece/: checkpoints' tokenizers published only as SentencePiece's
tokenizer.model, and what transformers 5.24 makes of them (`expected.json`: ids with and
without special tokens, and the text of each decode). swajax converts the same files at load
and must give the same (tests/test_tokenizer_forms.py).

Each folder is a small model trained here by the `sentencepiece` library itself, with the
settings the families publish (normalizer, dummy prefix, byte fallback, special pieces) and a
tokenizer_config.json in their publishers' form (Gemma's also with Gemma 3's published chat
template rendered over it with the generation prompt):

- llama: BPE, Llama 2's settings (identity normalizer, dummy prefix, byte fallback, digits
  split), `LlamaTokenizer`, `legacy: false` (Llama 2's and Mistral's current configs).
- llama-legacy: the same model, `legacy: true` and no `add_bos_token` (the class's default).
- gemma: BPE, Gemma's settings (no dummy prefix, pieces for turns as user-defined symbols,
  whitespace-only pieces), `GemmaTokenizer`.
- bpe: Llama's model settings with user-defined pieces, class `PreTrainedTokenizerFast`
  (transformers then follows the model file: the generic route).
- unigram: a Unigram model with SentencePiece's default NFKC normalizer and extra-whitespace
  removal, tokenizer class `TokenizersBackend` (transformers then follows the model's own
  settings).

Run in an environment with transformers 5.24.0 and sentencepiece (the SGLang peer's has them),
from the repository root:

    .venvs/sglang/bin/python tools/make_sentencepiece_fixtures.py
"""

import io
import json
import random
import shutil
from pathlib import Path

import sentencepiece as spm
from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "sentencepiece"

CORPUS = [
    "Sliding window attention keeps the last few thousand tokens of each layer.",
    "A full attention layer reads every token; a window layer reads W tokens before the query.",
    "The radix cache shares prefixes between requests, and evicts the least recently used.",
    "Pages of sixteen tokens hold the keys and values; the allocator hands them out.",
    "<start_of_turn>user\nWhat is the window?<end_of_turn>\n<start_of_turn>model\nFour.",
    "Numbers like 2026, 4096 and 131072 appear in configs: 0.5 and 1e-6 too.",
    "Tabs\tand\nnewlines\n\nmatter to code:    def f(x):\n        return x + 1",
    "Hello world. hello World! HELLO?",
] * 20
TEXTS = [
    "Hello world",
    "  two leading spaces and two trailing  ",
    "Tabs\tand\nnewlines\n\nin code:    return x + 1",
    "digits 131072 and 2026",
    "bytes: é 漢字 😀 ÿ",
    "ligature ﬁ and full-width ＡＢＣ",
    "<s>special tokens</s> inside text <unk>",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "<bos><start_of_turn>user\n  spaced  <end_of_turn>",
    "▁already marked",
    "▁",
    "",
    " ",
    *CORPUS[:8],
]


def _word_salad(count: int) -> list[str]:
    """Texts mixing the corpus's words with odd spacing, case and punctuation (seeded)."""
    rng = random.Random(0)
    words = " ".join(CORPUS[:8]).replace("\n", " ").split()
    texts = []
    for _ in range(count):
        picked = [rng.choice(words) for _ in range(rng.randint(1, 12))]
        seps = [rng.choice([" ", " ", " ", "  ", "\n", "\t", "", " ▁"]) for _ in picked]
        text = "".join(w.upper() if rng.random() < 0.1 else w + s for w, s in zip(picked, seps))
        texts.append(text)
    return texts


TEXTS += _word_salad(40)
CHAT = [
    {"role": "system", "content": "Answer  in one word."},
    {"role": "user", "content": "What is the window?"},
    {"role": "assistant", "content": "Four."},
    {"role": "user", "content": "And the page? é 😀"},
]
COMMON = dict(vocab_size=400, character_coverage=1.0, num_threads=1, minloglevel=2)
LLAMA = dict(
    COMMON,
    model_type="bpe",
    byte_fallback=True,
    normalization_rule_name="identity",
    remove_extra_whitespaces=False,
    add_dummy_prefix=True,
    split_digits=True,
    allow_whitespace_only_pieces=True,
    unk_id=0,
    bos_id=1,
    eos_id=2,
    pad_id=-1,
)
GEMMA = dict(
    LLAMA,
    add_dummy_prefix=False,
    user_defined_symbols=["<start_of_turn>", "<end_of_turn>", "\n\n", "    "],
    pad_id=0,
    eos_id=1,
    bos_id=2,
    unk_id=3,
    pad_piece="<pad>",
    eos_piece="<eos>",
    bos_piece="<bos>",
    unk_piece="<unk>",
)
UNIGRAM = dict(COMMON, model_type="unigram", vocab_size=120, control_symbols=["<sep>"])
# A BPE whose settings the generic route must follow: dummy prefix, no normalizer, byte
# fallback, user-defined pieces (kept whole, never merged).
SPM_BPE = dict(LLAMA, user_defined_symbols=["<|turn|>", "ion"], control_symbols=["<sep>"])


def _added(pieces: dict[int, str], special=True) -> dict:
    entry = dict(lstrip=False, normalized=False, rstrip=False, single_word=False)
    return {str(i): dict(entry, content=p, special=special) for i, p in pieces.items()}


FOLDERS = {
    "llama": (
        LLAMA,
        dict(
            tokenizer_class="LlamaTokenizer",
            add_bos_token=True,
            add_eos_token=False,
            legacy=False,
            bos_token="<s>",
            eos_token="</s>",
            unk_token="<unk>",
            added_tokens_decoder=_added({0: "<unk>", 1: "<s>", 2: "</s>"}),
            clean_up_tokenization_spaces=False,
        ),
    ),
    "llama-legacy": (
        LLAMA,
        dict(
            tokenizer_class="LlamaTokenizerFast",
            legacy=True,
            bos_token="<s>",
            eos_token="</s>",
            unk_token="<unk>",
        ),
    ),
    "gemma": (
        GEMMA,
        dict(
            tokenizer_class="GemmaTokenizer",
            add_bos_token=True,
            add_eos_token=False,
            bos_token="<bos>",
            eos_token="<eos>",
            pad_token="<pad>",
            unk_token="<unk>",
            added_tokens_decoder=_added(
                {
                    0: "<pad>",
                    1: "<eos>",
                    2: "<bos>",
                    3: "<unk>",
                    4: "<start_of_turn>",
                    5: "<end_of_turn>",
                }
            ),
        ),
    ),
    "bpe": (
        SPM_BPE,
        dict(tokenizer_class="PreTrainedTokenizerFast", bos_token="<s>", eos_token="</s>"),
    ),
    "unigram": (
        UNIGRAM,
        dict(
            tokenizer_class="TokenizersBackend",
            add_bos_token=True,
            bos_token="<s>",
            eos_token="</s>",
        ),
    ),
}


def train(settings: dict) -> bytes:
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS), model_writer=model, **settings)
    return model.getvalue()


def main() -> None:
    if OUT.exists():
        shutil.rmtree(OUT)
    for name, (settings, config) in FOLDERS.items():
        folder = OUT / name
        folder.mkdir(parents=True)
        (folder / "tokenizer.model").write_bytes(train(settings))
        (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")
        tok = AutoTokenizer.from_pretrained(folder)
        cases = []
        for text in TEXTS:
            ids = tok(text)["input_ids"]
            cases.append(
                dict(
                    text=text,
                    ids=ids,
                    plain_ids=tok(text, add_special_tokens=False)["input_ids"],
                    decoded=tok.decode(ids, skip_special_tokens=True),
                )
            )
        expected = dict(tokenizer=type(tok).__name__, vocab=len(tok), cases=cases)
        if name == "gemma":  # the family's published template over its own tokenizer form
            template = (OUT.parent / "published_templates" / "gemma-3.jinja").read_text()
            kwargs = dict(chat_template=template, add_generation_prompt=True)
            text = tok.apply_chat_template(CHAT, tokenize=False, **kwargs)
            ids = tok.apply_chat_template(CHAT, return_dict=False, **kwargs)
            expected["chat"] = dict(messages=CHAT, text=text, ids=ids)
        text = json.dumps(expected, indent=1, ensure_ascii=False) + "\n"
        (folder / "expected.json").write_text(text)
        print(f"{name}: {type(tok).__name__}, {len(tok)} tokens, {len(cases)} texts")


if __name__ == "__main__":
    main()
