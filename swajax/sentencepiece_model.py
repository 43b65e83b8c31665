"""A tokenizer published only as SentencePiece's tokenizer.model, converted at load into a
`tokenizers` Tokenizer the way transformers 5 converts it, so text and ids match
`AutoTokenizer.from_pretrained` on the same folder. The model file is read with the
`sentencepiece` package's own message definition (it needs `protobuf`, which orbax brings).

transformers builds the pipeline from the tokenizer class the folder names: Llama's (Llama 2,
Mistral) and Gemma's have their own, fixed whatever the model file says; any other
class with no pipeline of its own follows the model file's settings (normalizer, dummy prefix,
whitespace, user-defined pieces), which is how `SentencePieceProcessor` itself encodes."""

from __future__ import annotations

import json
import re
from pathlib import Path

from swajax import special_tokens

# transformers' tokenizer classes by pipeline; a folder without `tokenizer_class` gets its
# model type's class, as AutoTokenizer does.
LLAMA_CLASSES = ("LlamaTokenizer", "LlamaTokenizerFast")
GEMMA_CLASSES = ("GemmaTokenizer", "GemmaTokenizerFast")
SPM_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")
MODEL_TYPE_CLASSES = {
    "llama": "LlamaTokenizer",
    "mistral": "LlamaTokenizer",
    "gemma": "GemmaTokenizer",
    "gemma2": "GemmaTokenizer",
    "gemma3": "GemmaTokenizer",
    "gemma3_text": "GemmaTokenizer",
}
# Each class's special tokens where tokenizer_config.json does not name them.
DEFAULT_TOKENS = {
    "llama": dict(unk_token="<unk>", bos_token="<s>", eos_token="</s>"),
    "gemma": dict(
        unk_token="<unk>",
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        mask_token="<mask>",
    ),
    "spm": {},
}
# SentencePiece's piece types (sentencepiece_model.proto).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
UNIGRAM = 1


def sentencepiece_tokenizer(path: Path):
    """`path`/tokenizer.model as a `tokenizers` Tokenizer. ValueError naming the class when the
    folder's tokenizer class builds a pipeline swajax does not know."""
    from sentencepiece import sentencepiece_model_pb2
    from tokenizers import AddedToken, processors

    proto = sentencepiece_model_pb2.ModelProto()
    try:
        proto.ParseFromString((path / "tokenizer.model").read_bytes())
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError, whichever runtime
        raise ValueError(f"{path}/tokenizer.model is not a SentencePiece model: {e}") from e
    if not proto.pieces or not any(p.type == NORMAL for p in proto.pieces):
        raise ValueError(f"{path}/tokenizer.model is not a SentencePiece model: it has no pieces")
    config = _json(path / "tokenizer_config.json")
    name = config.get("tokenizer_class") or MODEL_TYPE_CLASSES.get(
        _json(path / "config.json").get("model_type")
    )
    family = _family(name, path)
    vocab = {piece.piece: i for i, piece in enumerate(proto.pieces)}
    if family == "llama":
        tok = _llama(vocab, config)
    elif family == "gemma":
        tok = _gemma(vocab, proto)
    else:
        tok = _from_model_file(proto, config)
    tokens = {**DEFAULT_TOKENS[family], **_spec_tokens(proto, family)}
    tokens.update(special_tokens.named(config))
    tok.add_tokens(_added_tokens(proto, config, tokens, family, AddedToken))
    if config.get("add_bos_token", False) or config.get("add_eos_token", False):
        tok.post_processor = _bos_eos(tok, config, tokens, processors)
    return tok


def _family(name: str | None, path: Path) -> str:
    if name in LLAMA_CLASSES:
        return "llama"
    if name in GEMMA_CLASSES:
        return "gemma"
    if name is None or name in SPM_CLASSES:
        return "spm"
    raise ValueError(
        f"{path}/tokenizer.model: tokenizer class {name!r} builds its own pipeline, which swajax "
        f"does not know (it converts {', '.join(LLAMA_CLASSES + GEMMA_CLASSES + SPM_CLASSES)}): "
        "write tokenizer.json once with transformers "
        "(AutoTokenizer.from_pretrained(folder).save_pretrained(folder))"
    )


def _llama(vocab: dict, config: dict):
    """Llama's pipeline: byte-fallback BPE; a '▁' before the text (before every span between
    added tokens when `legacy`), none with `add_prefix_space: false`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    prefix = config.get("add_prefix_space")
    prefix = True if prefix is None else bool(prefix)
    legacy = bool(config.get("legacy", False))
    tok = Tokenizer(
        models.BPE(vocab=vocab, merges=_merges_by_id(vocab), fuse_unk=True, byte_fallback=True)
    )
    scheme = ("always" if legacy else "first") if prefix else "never"
    tok.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="▁", prepend_scheme=scheme, split=False
    )
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    return tok


def _gemma(vocab: dict, proto):
    """Gemma's pipeline: byte-fallback BPE over the text with spaces as '▁', split after each
    space; no dummy prefix."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    unk = proto.trainer_spec.unk_piece or "<unk>"
    bpe = models.BPE(
        vocab=vocab, merges=_merges_by_id(vocab), fuse_unk=True, unk_token=unk, byte_fallback=True
    )
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    return tok


def _merges_by_id(vocab: dict) -> list[tuple[str, str]]:
    """Every split of a piece into two pieces, ranked by the merged piece's id (SentencePiece's
    BPE ids follow merge order), then by the halves' lengths; a piece's splits by their ids."""
    merges = []
    for piece, rank in vocab.items():
        local = [
            (piece[:k], piece[k:], rank)
            for k in range(1, len(piece))
            if piece[:k] in vocab and piece[k:] in vocab
        ]
        merges += sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]]))
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])))
    return [(a, b) for a, b, _ in merges]


def _from_model_file(proto, config: dict):
    """A pipeline from the model file's own settings, encoding as `SentencePieceProcessor`
    does: its normalizer (precompiled map, extra-whitespace removal, spaces as '▁'), the dummy
    prefix, user-defined pieces kept whole, BPE merges ranked by score or a Unigram model."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    spec, trainer = proto.normalizer_spec, proto.trainer_spec
    pieces = list(proto.pieces)
    names = {int(i): t["content"] for i, t in (config.get("added_tokens_decoder") or {}).items()}
    kept = {p.piece for i, p in enumerate(pieces) if i not in names}
    token = [
        names[i] if names.get(i) not in (None, *kept) else p.piece for i, p in enumerate(pieces)
    ]
    user_defined = [token[i] for i, p in enumerate(pieces) if p.type == USER_DEFINED]
    byte_fallback = trainer.byte_fallback
    if trainer.model_type == UNIGRAM:
        scored = [(t, p.score) for t, p in zip(token, pieces, strict=True)]
        model = models.Unigram(scored, unk_id=trainer.unk_id, byte_fallback=byte_fallback)
    else:
        vocab = {t: i for i, t in enumerate(token)}
        normal = {token[i]: (p.score, i) for i, p in enumerate(pieces) if p.type == NORMAL}
        ranked = sorted(
            (-score, i, t[:k], t[k:])
            for t, (score, i) in normal.items()
            for k in range(1, len(t))
            if t[:k] in normal and t[k:] in normal
        )
        model = models.BPE(
            vocab=vocab,
            merges=[(a, b) for _, _, a, b in ranked],
            unk_token=trainer.unk_piece,
            fuse_unk=True,
            byte_fallback=byte_fallback,
            ignore_merges=bool(user_defined),
        )
    tok = Tokenizer(model)
    legacy = bool(config.get("legacy", True))
    steps = []
    if spec.precompiled_charsmap:
        steps.append(normalizers.Precompiled(spec.precompiled_charsmap))
    if spec.remove_extra_whitespaces:  # spaces only: SentencePiece keeps newlines and tabs
        steps += [
            normalizers.Replace(Regex(r"\A +| +\z"), ""),
            normalizers.Replace(Regex(" {2,}"), " "),
        ]
    if spec.escape_whitespaces:
        steps.append(normalizers.Replace(" ", "▁"))
    if spec.add_dummy_prefix and legacy:
        # SentencePiece adds its prefix even before a '▁' the text starts with; Metaspace not.
        steps.append(normalizers.Replace(Regex(r"\A▁"), "▁▁"))
    tok.normalizer = normalizers.Sequence(steps)
    splits = []
    if spec.add_dummy_prefix:
        scheme = "always" if legacy else "first"
        splits.append(pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme, split=False))
    if user_defined:
        whole = "|".join(re.escape(p) for p in sorted(user_defined, key=len, reverse=True))
        splits.append(pre_tokenizers.Split(Regex(whole), behavior="isolated"))
    if splits:
        tok.pre_tokenizer = pre_tokenizers.Sequence(splits)
    steps = [decoders.Replace("▁", " ")] + ([decoders.ByteFallback()] if byte_fallback else [])
    if spec.add_dummy_prefix:
        steps += [decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    elif byte_fallback:
        steps.append(decoders.Fuse())
    tok.decoder = decoders.Sequence(steps)
    return tok


def _spec_tokens(proto, family: str) -> dict:
    """The model file's own unknown, beginning and end pieces, which transformers names only
    for a class without defaults of its own."""
    if family != "spm":
        return {}
    trainer = proto.trainer_spec
    return {
        key: piece or default
        for key, index, piece, default in (
            ("bos_token", trainer.bos_id, trainer.bos_piece, "<s>"),
            ("eos_token", trainer.eos_id, trainer.eos_piece, "</s>"),
            ("unk_token", trainer.unk_id, trainer.unk_piece, "<unk>"),
        )
        if index >= 0
    }


def _added_tokens(proto, config: dict, named: dict, family: str, AddedToken) -> list:
    """The tokens matched in text before the model sees it: the file's control pieces
    (special) and, for Llama's and Gemma's pipelines, its user-defined ones (not special);
    tokenizer_config.json's added tokens with their flags; the named special tokens."""
    tokens: dict[str, object] = {}
    for piece in proto.pieces:
        if piece.type == CONTROL or (piece.type == USER_DEFINED and family != "spm"):
            special = piece.type == CONTROL
            tokens[piece.piece] = AddedToken(piece.piece, normalized=False, special=special)
    decoder = config.get("added_tokens_decoder") or {}
    for _, entry in sorted(decoder.items(), key=lambda item: int(item[0])):
        flags = {k: entry[k] for k in ("lstrip", "rstrip", "single_word", "normalized", "special")}
        if family == "spm" and proto.normalizer_spec.add_dummy_prefix:
            flags["normalized"] = False
        tokens[entry["content"]] = AddedToken(entry["content"], **flags)
    for content in named.values():
        if content not in tokens:
            tokens[content] = AddedToken(content, special=True)
        elif not tokens[content].special:
            tokens[content] = AddedToken(content, normalized=False, special=True)
    return list(tokens.values())


def _bos_eos(tok, config: dict, named: dict, processors):
    """`add_bos_token` / `add_eos_token` (both off unless the config says) around each text."""
    bos, eos = named.get("bos_token"), named.get("eos_token")
    add_bos = bool(config.get("add_bos_token", False)) and bos is not None
    add_eos = bool(config.get("add_eos_token", False)) and eos is not None
    single = (["$A"] if not add_bos else [bos, "$A"]) + ([eos] if add_eos else [])
    pair = single + ([f"{bos}:1"] if add_bos else []) + ["$B:1"] + ([f"{eos}:1"] if add_eos else [])
    used = {t for t, on in ((bos, add_bos), (eos, add_eos)) if on}
    return processors.TemplateProcessing(
        single=" ".join(single),
        pair=" ".join(pair),
        special_tokens=[(t, tok.token_to_id(t)) for t in sorted(used)],
    )


def _json(file: Path) -> dict:
    return json.loads(file.read_text()) if file.exists() else {}
