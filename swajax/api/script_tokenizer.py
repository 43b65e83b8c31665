"""`LLM.get_tokenizer()`: the methods vLLM scripts call on the tokenizer it returns (a
transformers tokenizer there): encode / decode / __call__, apply_chat_template (transformers'
defaults: no generation prompt unless asked, token ids unless `tokenize=False`), the special
token ids, the vocabulary. Over swajax's own `Tokenizer` (tokenizer.json through `tokenizers`)
and the checkpoint's chat template. Host code."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from swajax.api.chat_messages import flattened, open_end
from swajax.errors import InputError
from swajax.tokenizer import unreadable


class ScriptTokenizer:
    def __init__(self, tokenizer, chat_template, eos_token_ids: tuple[int, ...]):
        """`tokenizer`: swajax's `Tokenizer`; `chat_template`: a function (template text or
        None) -> ChatTemplate; `eos_token_ids`: the checkpoint's stop ids."""
        if tokenizer.hf is None:
            if tokenizer.missing is not None:
                raise InputError(f"get_tokenizer: {unreadable(tokenizer.missing)}")
            raise InputError(
                "get_tokenizer: the embedded model has no tokenizer (its ids are bytes)"
            )
        self._tok, self._hf, self._template = tokenizer, tokenizer.hf, chat_template
        self.eos_token_id = eos_token_ids[0] if eos_token_ids else None
        self.all_special_ids = sorted(set(eos_token_ids))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._hf.encode(text, add_special_tokens=add_special_tokens).ids

    def __call__(self, text: str | Sequence[str], add_special_tokens: bool = True) -> dict:
        if isinstance(text, str):
            return {"input_ids": self.encode(text, add_special_tokens)}
        return {"input_ids": [self.encode(t, add_special_tokens) for t in text]}

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def batch_decode(self, batch: Sequence[Sequence[int]], skip_special_tokens: bool = False):
        return [self.decode(ids, skip_special_tokens) for ids in batch]

    def apply_chat_template(
        self,
        conversation: Sequence[Mapping],
        tools: list[dict] | None = None,
        chat_template: str | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool = False,
        tokenize: bool = True,
        **kwargs,
    ):
        """transformers' signature and defaults (the rendered text with `tokenize=False`)."""
        variables = dict(kwargs, add_generation_prompt=add_generation_prompt)
        if tools is not None:
            variables["tools"] = tools
        messages = flattened([dict(m) for m in conversation])
        text = self._template(chat_template).render_messages(messages, **variables)
        if continue_final_message:
            text = open_end(text, messages[-1])
        return self._tok.encode_rendered(text) if tokenize else text

    def convert_ids_to_tokens(self, ids):
        if isinstance(ids, int):
            return self._hf.id_to_token(ids)
        return [self._hf.id_to_token(i) for i in ids]

    def convert_tokens_to_ids(self, tokens):
        if isinstance(tokens, str):
            return self._hf.token_to_id(tokens)
        return [self._hf.token_to_id(t) for t in tokens]

    def get_vocab(self) -> dict[str, int]:
        return self._hf.get_vocab()

    @property
    def vocab_size(self) -> int:
        return self._hf.get_vocab_size(with_added_tokens=False)

    def __len__(self) -> int:
        return self._hf.get_vocab_size(with_added_tokens=True)
