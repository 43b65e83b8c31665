"""Adapters for the conformance kit's tests (swajax.conformance): an independent implementation
and a deliberately broken one.

`PythonModelAdapter`: the plain-Python allocator written from the spec
(`allocator_model.ModelAllocator`) under swajax's prefix cache; it has no attention or model,
so those cases are skipped. `SinklessAdapter`: swajax, except that its attention forgets the
sinks, a plausible backend bug: exactly the cases with sinks must fail.
"""

from __future__ import annotations

import numpy as np

from helpers.allocator_model import ModelAllocator
from swajax.conformance.adapter import SwajaxAdapter
from swajax.prefix_cache import RadixCache
from swajax.prefix_cache.policy import policy_of


class ModelReleaser:
    """ModelAllocator with the allocator interface the prefix cache and replay call."""

    def __init__(self, full_size, swa_size, page_size, mode):
        self.model, self.page_size, self.mode = (
            ModelAllocator(full_size, swa_size, page_size, mode),
            page_size,
            mode,
        )

    def available(self):
        full, swa, _ = self.model.available()
        return full, swa

    def alloc_extend(self, prefix_lens, seq_lens, last_loc):
        status, slots, _ = self.model.alloc_extend(
            [int(x) for x in prefix_lens], [int(x) for x in seq_lens], [int(x) for x in last_loc]
        )
        return int(status), np.asarray(slots, np.int32)

    def alloc_decode(self, seq_lens, last_loc):
        status, slots, _ = self.model.alloc_decode(
            [int(x) for x in seq_lens], [int(x) for x in last_loc]
        )
        return int(status), np.asarray(slots, np.int32)

    def free(self, slots):
        self.model.free([int(s) for s in slots])

    def free_swa(self, slots):
        self.model.free_swa([int(s) for s in slots])

    def move_swa(self, dst, src):
        self.model.move_swa([int(s) for s in dst], [int(s) for s in src])

    def translate(self, slots):
        return np.asarray([self.model.translate(int(s)) for s in slots], np.int32)

    def flush(self):
        pass


class PythonModelAdapter:
    def allocator_and_cache(self, header):
        alloc = ModelReleaser(
            header["full_size"], header["swa_size"], header["page_size"], header["mode"]
        )
        cache = RadixCache(
            alloc,
            page_size=header["page_size"],
            window=header["window"],
            pool_mode=header["mode"],
            cap_leaf_to_window=header["cap_leaf_to_window"],
            policy=policy_of(header.get("profile", "swajax")),
        )
        return alloc, cache

    def attention(self, case):
        raise NotImplementedError("an allocator model: no attention")

    def logits(self, model_dir, prompt):
        raise NotImplementedError("an allocator model: no model")


class SinklessAdapter(SwajaxAdapter):
    def allocator_and_cache(self, header):
        raise NotImplementedError("an attention bug: the operation cases are not its subject")

    def attention(self, case):
        return super().attention({k: v for k, v in case.items() if k != "sinks"})
