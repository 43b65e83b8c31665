"""SGLang 0.5.23 itself behind the conformance kit's adapter protocol: its real
`SWATokenToKVPoolAllocator` and `UnifiedRadixCache` (FULL + SWA components, the default Rust
tree core), driven with a swajax trace's operations one by one; for an all-SWA pool its
`PureSWATokenToKVPoolAllocator` and `PureSWARadixCache` (see `PureCache`).

Runs in SGLang's own environment (`tests/peers/setup_sglang.sh`), which has torch and no JAX;
swajax's replay code is host-only. Each trace operation maps onto the call SGLang's scheduler
makes at that point:

    match             match_prefix(MatchPrefixParams(key))
    lock / unlock     lock(node id) / unlock(TreeLock)
    release_swa       release_swa(TreeLock)           (the window moved past the prefix)
    evict             evict(EvictParams(num_tokens, swa_num_tokens))
    insert            insert(InsertParams(...))
    cache_unfinished  checkpoint(req, up_to=len(tokens))          (a chunk checkpoint)
    cache_finished    checkpoint + free_kv_row + unlock            (release_kv_cache)
    alloc_* / free*   the allocator's own methods (page size 1: `alloc(n)`)

A request is a real `Req` whose req_to_token row holds the trace's slots for the call. The
eager out-of-window free that SGLang runs inside a checkpoint is a separate `free_swa` line in a
trace, so it is switched off here (SGLANG_OPT_UNIFIED_CACHE_FREE_OUT_OF_WINDOW_SLOTS=0) and
replayed from the trace instead: the same slots, freed once.
"""

from __future__ import annotations

import logging
import os
from array import array

os.environ.setdefault("SGLANG_OPT_UNIFIED_CACHE_FREE_OUT_OF_WINDOW_SLOTS", "0")
logging.disable(logging.WARNING)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req  # noqa: E402
from sglang.srt.mem_cache.allocator.swa import (  # noqa: E402
    PureSWATokenToKVPoolAllocator,
    SWATokenToKVPoolAllocator,
)
from sglang.srt.mem_cache.base_prefix_cache import (  # noqa: E402
    EvictParams,
    InsertParams,
    MatchPrefixParams,
)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool  # noqa: E402
from sglang.srt.mem_cache.pure_swa_radix_cache import PureSWARadixCache  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool  # noqa: E402
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType  # noqa: E402
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402
from sglang.srt.server_args import (  # noqa: E402
    ServerArgs,
    set_global_server_args_for_scheduler,
)

MAX_CONTEXT = 1 << 17


def _key(tokens) -> RadixKey:
    return RadixKey(array("q", [int(t) for t in tokens]))


def _ints(x) -> np.ndarray:
    return np.asarray(torch.as_tensor(x).reshape(-1).tolist(), np.int32)


def _kv_pool(size: int, size_swa: int, ps: int, *, full_layers: list[int]) -> SWAKVPool:
    """The smallest KV pool SGLang's allocators accept: one SWA layer, `full_layers`."""
    return SWAKVPool(
        size=size,
        size_swa=size_swa,
        page_size=ps,
        dtype=torch.bfloat16,
        head_num=1,
        head_dim=4,
        swa_attention_layer_ids=[0],
        full_attention_layer_ids=full_layers,
        device="cpu",
    )


class Allocator:
    """SGLang's hybrid allocator under swajax's method names."""

    def __init__(self, header: dict):
        ps = header["page_size"]
        self.ps = self.page_size = ps
        pool = _kv_pool(header["full_size"], header["swa_size"], ps, full_layers=[1])
        self.sg = SWATokenToKVPoolAllocator(
            size=header["full_size"],
            size_swa=header["swa_size"],
            page_size=ps,
            dtype=torch.bfloat16,
            device="cpu",
            kvcache=pool,
            need_sort=False,
        )

    mode = "hybrid"  # (the only layout SGLang's unified FULL + SWA tree has)

    def available(self):
        return int(self.sg.full_available_size()), int(self.sg.swa_available_size())

    def translate(self, slots):
        index = torch.as_tensor(np.asarray(slots, np.int64))
        return _ints(self.sg.full_to_swa_index_mapping[index])

    def _result(self, out, pages: int):
        """SGLang returns None when either pool is short and does not say which: the
        protocol's status is read off the free counts it reports (full short first, as the
        protocol orders them)."""
        if out is None:
            full, swa = self.available()
            need = pages * self.ps
            return (1 if need > full else 2 if need > swa else 3), np.zeros(0, np.int32)
        return 0, _ints(out)

    def _pages(self, prefix_lens, seq_lens) -> int:
        ps = self.ps
        return sum(-(-int(s) // ps) - -(-int(p) // ps) for p, s in zip(prefix_lens, seq_lens))

    def alloc_extend(self, prefix_lens, seq_lens, last_loc):
        pre = torch.tensor([int(x) for x in prefix_lens], dtype=torch.int64)
        seq = torch.tensor([int(x) for x in seq_lens], dtype=torch.int64)
        n = int((seq - pre).sum())
        pages = self._pages(prefix_lens, seq_lens)
        if self.ps == 1:
            return self._result(self.sg.alloc(n), pages)
        loc = torch.tensor([int(x) for x in last_loc], dtype=torch.int64)
        return self._result(self.sg.alloc_extend(pre, pre, seq, seq, loc, n), pages)

    def alloc_decode(self, seq_lens, last_loc):
        pages = self._pages([int(s) - 1 for s in seq_lens], seq_lens)
        if self.ps == 1:
            return self._result(self.sg.alloc(len(seq_lens)), pages)
        seq = torch.tensor([int(x) for x in seq_lens], dtype=torch.int64)
        loc = torch.tensor([int(x) for x in last_loc], dtype=torch.int64)
        return self._result(self.sg.alloc_decode(seq, seq, loc), pages)

    def free(self, slots):
        self.sg.free(torch.as_tensor(np.asarray(slots, np.int64)))

    def free_swa(self, slots):
        self.sg.free_swa(torch.as_tensor(np.asarray(slots, np.int64)))


class Handle:
    """A lock as the replay numbers it: SGLang's `TreeLock`, plus the trace id."""

    def __init__(self, lock):
        self.lock = lock


class Match:
    def __init__(self, slots, node, tail_miss):
        self.slots, self.node, self.tail_miss = slots, node, tail_miss

    def __len__(self):
        return len(self.slots)


class Cache:
    """SGLang's unified radix tree under swajax's method names (see the module docstring)."""

    TREE, COMPONENTS = UnifiedRadixCache, (ComponentType.FULL, ComponentType.SWA)

    def __init__(self, header: dict, alloc: Allocator):
        ps = header["page_size"]
        self.ps, self.window, self.alloc = ps, header["window"], alloc
        self.pool = ReqToTokenPool(
            size=4, max_context_len=MAX_CONTEXT, device="cpu", enable_memory_saver=False
        )
        params = CacheInitParams(
            disable=False,
            req_to_token_pool=self.pool,
            token_to_kv_pool_allocator=alloc.sg,
            page_size=ps,
            sliding_window_size=header["window"],
            tree_components=self.COMPONENTS,
        )
        self.sg = self.TREE(params)
        self.root = self.sg.root_node_handle()
        self._wrapped: dict[int, Handle] = {}
        self._sg_lock = self.sg.lock
        self.sg.lock = self._lock_from_sglang  # its checkpoint's re-lock, numbered by replay
        self._rid = 0
        self._finishing = False

    # Sizes -----------------------------------------------------------------------------------
    full_evictable = property(lambda self: int(self.sg.full_evictable_size()))
    full_protected = property(lambda self: int(self.sg.full_protected_size()))
    swa_evictable = property(lambda self: int(self.sg.swa_evictable_size()))
    swa_protected = property(lambda self: int(self.sg.swa_protected_size()))

    # Locks -----------------------------------------------------------------------------------
    def walk(self, key):
        """The node at the end of `key` (a lock's node lies on a node boundary)."""
        n, node, pinned = self.sg.tree_core.match_full_device_prefix(_key(key))
        if n != len(key) or pinned != n:
            raise LookupError(f"no node ends at token {len(key)} (full match {n})")
        return [node]

    def lock(self, node):
        handle = Handle(self._sg_lock(node))
        self._wrapped[id(handle.lock)] = handle
        return handle

    def _lock_from_sglang(self, node, skip_lock_components=()):
        if self._finishing:  # the lock a finished request's checkpoint takes and drops at once
            return self._sg_lock(node)
        return self.lock(node).lock  # `self.lock` is the replay's numbering wrapper

    def unlock(self, handle):
        if handle is not None:
            self.sg.unlock(handle.lock)

    def release_swa(self, handle):
        if handle is not None:
            self.sg.release_swa(handle.lock)

    # Match, evict, insert --------------------------------------------------------------------
    def match(self, tokens):
        result = self.sg.match_prefix(MatchPrefixParams(key=_key(tokens).page_aligned(self.ps)))
        n = int(result.device_prefix_len)
        slots = _ints(self.sg.path_device_indices(result.last_device_node))[:n]
        full = (int(result.full_kv_hit_length) // self.ps) * self.ps
        return Match(slots, result.last_device_node, max(0, full - len(slots)))

    def evict(self, full_tokens=0, swa_tokens=0):
        r = self.sg.evict(EvictParams(num_tokens=int(full_tokens), swa_num_tokens=int(swa_tokens)))
        return int(r.num_tokens_evicted), int(r.swa_num_tokens_evicted)

    def insert(
        self, tokens, slots, prev_prefix_len=0, swa_evicted_seqlen=0, keep_tombstone_leaf=False
    ):
        key = _key(tokens).page_aligned(self.ps)
        params = InsertParams(
            key=key,
            value=torch.as_tensor(np.asarray(slots[: len(key)], np.int64)),
            prev_prefix_len=int(prev_prefix_len),
        )
        params.set_evicted_seqlen(ComponentType.SWA, int(swa_evicted_seqlen))
        return int(self.sg.insert(params).prefix_len)

    # Requests --------------------------------------------------------------------------------
    def _request(
        self, tokens, slots, cache_protected_len, swa_evicted_seqlen, handle, floor=0, branch=None
    ):
        self._rid += 1
        ids = array("q", [int(t) for t in tokens])
        req = Req(
            rid=f"trace-{self._rid}",
            origin_input_text="",
            origin_input_ids=ids,
            sampling_params=SamplingParams(temperature=0, max_new_tokens=1),
        )
        self.pool.alloc([req])
        row = torch.as_tensor(np.asarray(slots, np.int64)[: len(tokens)], dtype=torch.int32)
        self.pool.write((req.kv.req_pool_idx, slice(0, len(row))), row)
        req.output_ids = array("q")
        req.full_untruncated_fill_ids = ids
        req.extend_end = len(ids)
        req.kv.kv_committed_len = req.kv.kv_allocated_len = len(row)
        req.kv.cache_protected_len = int(cache_protected_len)
        req.kv.set_evicted_seqlen(ComponentType.SWA, int(swa_evicted_seqlen))
        req.kv.swa_evict_floor = int(floor)
        req.lock = None if handle is None else handle.lock
        req.extra_key = None
        req.swa_branching_seqlen = branch  # SGLang's own rule decides what it cuts
        return req

    def cache_unfinished(
        self,
        tokens,
        slots,
        *,
        cache_protected_len,
        swa_evicted_seqlen,
        handle,
        swa_branching_seqlen=None,
    ):
        req = self._request(
            tokens,
            slots,
            cache_protected_len,
            swa_evicted_seqlen,
            handle,
            branch=swa_branching_seqlen,
        )
        self.sg.checkpoint(req, up_to=len(tokens))
        n = req.kv.cache_protected_len
        prefix = _ints(self.pool.req_to_token[req.kv.req_pool_idx, :n])
        new = None if req.lock is None else self._wrapped.get(id(req.lock))
        self.pool.free(req)
        return prefix, new

    def cache_finished(
        self,
        tokens,
        slots,
        *,
        cache_protected_len,
        swa_evicted_seqlen,
        handle,
        insert=True,
        swa_evict_floor=0,
        swa_branching_seqlen=None,
    ):
        req = self._request(
            tokens,
            slots,
            cache_protected_len,
            swa_evicted_seqlen,
            handle,
            swa_evict_floor,
            swa_branching_seqlen,
        )
        req.finished_reason = FINISH_LENGTH(length=0)
        n = len(tokens)
        if insert:
            self._finishing = True
            try:
                self.sg.checkpoint(req, up_to=n)
            finally:
                self._finishing = False
        self.sg.free_kv_row(req.kv, [(req.kv.cache_protected_len, n)])
        self.sg.unlock(req.lock)
        self.sg.on_release(req, checkpointed=insert)
        self.pool.free(req)


class PureAllocator(Allocator):
    """SGLang's all-SWA allocator (`PureSWATokenToKVPoolAllocator`: one pool, page size 1)."""

    mode = "all_swa"

    def __init__(self, header: dict):
        if header["page_size"] != 1:
            raise NotImplementedError(
                f"page size {header['page_size']}: SGLang's all-SWA allocator takes 1 only"
            )
        self.ps = self.page_size = 1
        pool = _kv_pool(header["swa_size"], header["swa_size"], 1, full_layers=[])
        self.sg = PureSWATokenToKVPoolAllocator(
            header["swa_size"], 1, torch.bfloat16, "cpu", pool, need_sort=False
        )

    def available(self):
        n = int(self.sg.available_size())
        return n, n  # one pool: the same number twice (the protocol's convention)

    def _result(self, out, pages: int):
        if out is None:  # the one pool is the SWA pool
            return 2, np.zeros(0, np.int32)
        return 0, _ints(out)


class PureCache(Cache):
    """SGLang's `PureSWARadixCache`: a plain radix tree (RadixCache) under swajax's method
    names. Its requests carry the prefill-aware floor (`swa_evict_floor`) the trace names. It
    has one pool and no window lock: its sizes are reported twice, as the protocol does for one
    pool, and releasing a window is a no-op."""

    TREE, COMPONENTS = PureSWARadixCache, None

    full_evictable = swa_evictable = property(lambda self: int(self.sg.evictable_size()))
    full_protected = swa_protected = property(lambda self: int(self.sg.protected_size()))

    def walk(self, key):
        """The node at the end of `key`, found without touching recency (a match would)."""
        node, rest = self.sg.root_node, _key(key)
        while len(rest):
            child = node.children.get(rest.child_key(1))
            if child is None or child.key.match(rest) < len(child.key):
                raise LookupError(f"no node ends at token {len(key)}")
            node, rest = child, rest[len(child.key) :]
        return [node]

    def release_swa(self, handle):
        pass  # a plain tree's lock has no window part

    def match(self, tokens):
        result = self.sg.match_prefix(MatchPrefixParams(key=_key(tokens)))
        n = int(result.device_prefix_len)
        slots = _ints(self.sg.path_device_indices(result.last_device_node))[:n]
        return Match(slots, result.last_device_node, 0)

    def evict(self, full_tokens=0, swa_tokens=0):
        r = self.sg.evict(EvictParams(num_tokens=int(full_tokens), swa_num_tokens=int(swa_tokens)))
        n = int(r.num_tokens_evicted)
        return n, n

    def insert(
        self, tokens, slots, prev_prefix_len=0, swa_evicted_seqlen=0, keep_tombstone_leaf=False
    ):
        """`RadixCache.insert`, then the duplicates it exposed freed, as its `_insert_cache`
        does for a request (the protocol's insert frees them)."""
        key = _key(tokens)
        value = torch.as_tensor(np.asarray(slots[: len(key)], np.int64))
        n = int(self.sg.insert(InsertParams(key=key, value=value)).prefix_len)
        self.alloc.sg.free(value[int(prev_prefix_len) : n])
        return n


class SGLangAdapter:
    """The kit's adapter protocol (swajax.conformance.adapter) over SGLang 0.5.23."""

    def __init__(self):
        set_global_server_args_for_scheduler(ServerArgs(model_path="dummy"))

    def allocator_and_cache(self, header: dict):
        if header["mode"] not in ("hybrid", "all_swa"):
            raise NotImplementedError(
                f"pool mode {header['mode']!r}: SGLang's unified tree with FULL + SWA "
                "components is the hybrid case, its PureSWARadixCache the all-SWA one"
            )
        set_global_server_args_for_scheduler(
            ServerArgs(model_path="dummy", page_size=header["page_size"])
        )
        if header["mode"] == "all_swa":
            alloc = PureAllocator(header)
            return alloc, PureCache(header, alloc)
        alloc = Allocator(header)
        return alloc, Cache(header, alloc)

    def attention(self, case):
        raise NotImplementedError("the memory system only")

    def logits(self, model_dir, prompt):
        raise NotImplementedError("the memory system only")


def op_backend(header: dict):
    """SGLang's objects behind the interface `examples/kit_adapter.py` asks of a backend
    (`--backend peers.sglang_adapter:op_backend`, run from tests/)."""
    from helpers.op_backend import OpBackend

    return OpBackend(*SGLangAdapter().allocator_and_cache(header))
