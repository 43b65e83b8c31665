"""An allocator and prefix cache pair, as replay drives them (`swajax.trace.replay`'s backend:
swajax's own, the plain-Python model, a mutant, SGLang's objects), behind the one-method-per-
operation interface that `examples/kit_adapter.py` asks of a backend. No swajax import, so it
also runs in SGLang's environment.

Factories for `kit_adapter.py --backend`: `helpers.op_backend:swajax` and
`helpers.op_backend:mutant_<name>` (its name in `helpers.mutants.MUTANTS`, spaces as
underscores: `mutant_tombstone_leaf`).
"""

from __future__ import annotations

import numpy as np


class OpBackend:
    def __init__(self, alloc, cache):
        self.alloc, self.cache = alloc, cache

    def available(self):
        return self.alloc.available()

    def sizes(self):
        c = self.cache
        return c.full_evictable, c.full_protected, c.swa_evictable, c.swa_protected

    def alloc_extend(self, prefix_lens, seq_lens, last_loc):
        return self.alloc.alloc_extend(prefix_lens, seq_lens, last_loc)

    def alloc_decode(self, seq_lens, last_loc):
        return self.alloc.alloc_decode(seq_lens, last_loc)

    def free(self, slots):
        self.alloc.free(np.asarray(slots, np.int32))

    def free_swa(self, slots):
        self.alloc.free_swa(np.asarray(slots, np.int32))

    def translate(self, slots):
        return self.alloc.translate(np.asarray(slots, np.int32))

    def match(self, tokens):
        m = self.cache.match(tokens)
        return len(m), m.slots, m.tail_miss

    def lock(self, tokens):
        return self.cache.lock(self.cache.walk(tuple(tokens))[-1] if tokens else self.cache.root)

    def unlock(self, lock):
        self.cache.unlock(lock)

    def release_swa(self, lock):
        self.cache.release_swa(lock)

    def evict(self, full, swa):
        return self.cache.evict(full, swa)

    def insert(self, tokens, slots, prev_prefix_len, swa_evicted_seqlen, keep_tombstone_leaf):
        slots = np.asarray(slots, np.int32)
        return self.cache.insert(
            tokens, slots, prev_prefix_len, swa_evicted_seqlen, keep_tombstone_leaf
        )

    def cache_unfinished(
        self, tokens, slots, cache_protected_len, swa_evicted_seqlen, lock, **branch
    ):
        return self.cache.cache_unfinished(
            tokens,
            np.asarray(slots, np.int32),
            cache_protected_len=cache_protected_len,
            swa_evicted_seqlen=swa_evicted_seqlen,
            handle=lock,
            **branch,  # swa_branching_seqlen, where the case names one
        )

    def cache_finished(
        self, tokens, slots, cache_protected_len, swa_evicted_seqlen, lock, insert=True, **floor
    ):
        self.cache.cache_finished(
            tokens,
            np.asarray(slots, np.int32),
            cache_protected_len=cache_protected_len,
            swa_evicted_seqlen=swa_evicted_seqlen,
            handle=lock,
            insert=insert,
            **floor,  # swa_evict_floor / swa_branching_seqlen, where the case names one
        )


def swajax(header):
    from swajax.trace.replay import swajax_backend

    return OpBackend(*swajax_backend(header))


def __getattr__(name):
    """`mutant_<name>`: the reference pair with one planted bug (`helpers.mutants`)."""
    if not name.startswith("mutant_"):
        raise AttributeError(name)
    from helpers.mutants import MUTANTS, MutantAdapter

    mutant = {key.replace(" ", "_"): key for key in MUTANTS}[name[7:]]
    return lambda header: OpBackend(*MutantAdapter(mutant).allocator_and_cache(header))


def python_model(header):
    """The plain-Python allocator model under swajax's prefix cache (no JAX: fast)."""
    from helpers.conformance_adapters import PythonModelAdapter

    return OpBackend(*PythonModelAdapter().allocator_and_cache(header))
