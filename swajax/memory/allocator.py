"""The full->SWA token allocator as a frozen pytree updated by jit-compiled pure functions.

Two paged free lists (full pool, SWA pool) and the `full_to_swa` mapping. The full slot is the
only address the host sees; `full_to_swa[slot]` is its SWA slot (0 = none; the trailing entry is
a -1 sentinel so that translating -1 gives -1). Slot / page 0 of each pool is a dummy that padded
tokens write into and is never handed out.

Free lists are stacks: allocation pops pages from the top in batch order; a free pushes the freed
pages back so that the lowest freed page is on top (SGLang's paged allocator takes from the front
and prepends freed pages in ascending order: the same order).

Every operation checks **both** pools before touching either, and on any failure returns the
state unchanged with a non-zero `status`. Nothing raises inside jit. Batches are padded to a few
power-of-two buckets (request count and token count), so compiled code is reused.

Modes: "hybrid" (two pools + mapping), "single" (hybrid memory disabled: one pool for every layer,
translation is the identity, `free_swa` is a no-op) and "all_swa" (no full layers: the one pool
is the SWA pool, translation is the identity and `free_swa` frees the slots themselves, so a
caller must not later `free` what it already evicted).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from swajax.arith import bucket, ceil_div
from swajax.memory.padding import pad, token_positions
from swajax.memory.page_stack import PageStack
from swajax.sizing import PoolMode, SizingError

OK, FULL_SHORT, SWA_SHORT, SWA_LAST_LOC_MISSING = 0, 1, 2, 3
MIN_REQ_BUCKET, MIN_TOKEN_BUCKET = 8, 64


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AllocatorState:
    full: PageStack | None  # full pool pages (None in all_swa mode)
    swa: PageStack | None  # SWA pool pages (None in single mode)
    full_to_swa: jax.Array | None  # i32[full_size + page_size + 1], hybrid mode only
    page_size: int = dataclasses.field(metadata=dict(static=True))
    mode: PoolMode = dataclasses.field(metadata=dict(static=True))

    @property
    def primary(self) -> PageStack:
        """The pool whose slots are the addresses the host sees."""
        return self.swa if self.mode is PoolMode.ALL_SWA else self.full


class AllocResult(NamedTuple):
    status: jax.Array  # i32[]: OK, FULL_SHORT, SWA_SHORT or SWA_LAST_LOC_MISSING
    full_slots: jax.Array  # i32[T]: full slot of each new token (0 for padding)
    swa_slots: jax.Array  # i32[T]: its SWA slot (identity outside hybrid mode)


MAX_SLOT = 2**31 - 1


def check_sizes(full_size: int, swa_size: int, page_size: int, mode: PoolMode) -> None:
    """Raise a clear error if the pools cannot be built: sizes that are not positive multiples
    of the page size, or more slots than int32 ids address."""
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    sizes = {"full_size": full_size} if mode is not PoolMode.ALL_SWA else {}
    if mode is not PoolMode.SINGLE:
        sizes["swa_size"] = swa_size
    for name, size in sizes.items():
        if size < page_size or size % page_size:
            raise SizingError(f"{name}={size} must be a positive multiple of page_size={page_size}")
        # Slots are int32 on the device (page tables, req_to_token, the full -> SWA map).
        if size + page_size + 1 > MAX_SLOT:
            most = MAX_SLOT - page_size - 1
            raise SizingError(
                f"{name}={size} tokens is more than int32 slot ids address ({most} per pool): "
                "the KV budget is too large for one engine's pools; lower it"
            )


def init_allocator(full_size: int, swa_size: int, page_size: int, mode: PoolMode = PoolMode.HYBRID):
    """Empty allocator. Sizes are token counts (multiples of page_size)."""
    mode = PoolMode(mode)
    check_sizes(full_size, swa_size, page_size, mode)
    mapping = None
    if mode is PoolMode.HYBRID:
        mapping = np.zeros(full_size + page_size + 1, np.int32)
        mapping[-1] = -1  # host-built, like the page stacks: no program to compile
        mapping = jnp.asarray(mapping)
    return AllocatorState(
        full=PageStack.init(full_size // page_size) if mode is not PoolMode.ALL_SWA else None,
        swa=PageStack.init(swa_size // page_size) if mode is not PoolMode.SINGLE else None,
        full_to_swa=mapping,
        page_size=page_size,
        mode=mode,
    )


def translate(state: AllocatorState, full_slots: jax.Array) -> jax.Array:
    """Full slots -> SWA slots, one gather; -1 stays -1 (JAX would wrap or clamp it)."""
    if state.mode is not PoolMode.HYBRID:
        return full_slots
    return jnp.where(full_slots < 0, -1, state.full_to_swa[jnp.maximum(full_slots, 0)])


class Available(NamedTuple):
    full: jax.Array  # i32[]: free full-pool tokens
    swa: jax.Array  # i32[]: free SWA-pool tokens
    min: jax.Array  # i32[]: what a new token can get


def available(state: AllocatorState) -> Available:
    """Free tokens per pool; outside hybrid mode both are the one pool's count."""
    primary = state.primary.count * state.page_size
    swa = state.swa.count * state.page_size if state.mode is PoolMode.HYBRID else primary
    return Available(primary, swa, jnp.minimum(primary, swa))


# ---------------------------------------------------------------------------------------------
# Jitted cores (padded inputs)


def _extend_slots(stack, req, pos, valid, prefix_lens, seq_lens, last_loc, ps):
    """Slots of one pool for an extend: tail of the last page, then new pages in batch order."""
    first_new = ceil_div(prefix_lens, ps)
    new_pages = ceil_div(seq_lens, ps) - first_new
    page_base = jnp.cumsum(new_pages) - new_pages
    in_tail = pos < first_new[req] * ps
    page = jnp.where(valid & ~in_tail, stack.peek(page_base[req] + pos // ps - first_new[req]), 0)
    slot = jnp.where(in_tail, last_loc[req] + 1 + pos - prefix_lens[req], page * ps + pos % ps)
    return jnp.where(valid, slot, 0), page


def _status(state, num_pages, swa_last_loc, needs_last):
    """Check both pools (and that a continued page still has its SWA slot) before any change."""
    primary_short = num_pages > state.primary.count
    swa_short = num_pages > state.swa.count if state.mode is PoolMode.HYBRID else False
    missing = jnp.any(needs_last & (swa_last_loc <= 0))
    primary_code = SWA_SHORT if state.mode is PoolMode.ALL_SWA else FULL_SHORT
    conditions = [primary_short, jnp.asarray(swa_short), missing]
    return jnp.select(conditions, [primary_code, SWA_SHORT, SWA_LAST_LOC_MISSING], OK)


def _commit(state, status, num_pages, full_slots, swa_slots, full_pages, swa_pages):
    """Pop `num_pages` from each pool and pair the slots, only if status is OK.

    `full_pages` / `swa_pages` list the pages taken (per token, 0 where none).

    Branch-free (a masked count and a dropped scatter), so the donated buffers are updated in
    place; a `lax.cond` here made XLA copy the mapping on every call.
    """
    ok = status == OK
    taken = jnp.where(ok, num_pages, 0)
    full_pages, swa_pages = jnp.where(ok, full_pages, 0), jnp.where(ok, swa_pages, 0)
    mapping = state.full_to_swa
    if state.mode is PoolMode.HYBRID:
        # On failure every index falls off the end and is dropped; padding writes 0 into slot 0.
        mapping = mapping.at[jnp.where(ok, full_slots, mapping.shape[0])].set(
            swa_slots, mode="drop"
        )
    return dataclasses.replace(
        state,
        full=state.full.pop(taken, full_pages) if state.full is not None else None,
        swa=state.swa.pop(taken, swa_pages if state.mode is PoolMode.HYBRID else full_pages)
        if state.swa is not None
        else None,
        full_to_swa=mapping,
    )


def alloc_extend_core(state, prefix_lens, seq_lens, last_loc, num_tokens: int):
    """Traceable core of `alloc_extend` (padded inputs; `num_tokens` static)."""
    ps = state.page_size
    req, pos, valid = token_positions(prefix_lens, seq_lens, num_tokens)
    num_pages = jnp.sum(ceil_div(seq_lens, ps) - ceil_div(prefix_lens, ps))
    layout = functools.partial(
        _extend_slots,
        req=req,
        pos=pos,
        valid=valid,
        prefix_lens=prefix_lens,
        seq_lens=seq_lens,
        ps=ps,
    )
    full, full_pages = layout(state.primary, last_loc=last_loc)
    swa_last = translate(state, last_loc)
    swa, swa_pages = full, full_pages
    if state.mode is PoolMode.HYBRID:
        swa, swa_pages = layout(state.swa, last_loc=swa_last)
    needs_last = (prefix_lens % ps != 0) & (seq_lens > prefix_lens)
    status = _status(state, num_pages, swa_last, needs_last)
    state = _commit(state, status, num_pages, full, swa, full_pages, swa_pages)
    return state, AllocResult(status, full, swa)


def _decode_slots(stack, need_page, last_loc, valid, ps):
    page = jnp.where(need_page, stack.peek(jnp.cumsum(need_page) - 1), 0)
    return jnp.where(valid, jnp.where(need_page, page * ps, last_loc + 1), 0), page


def alloc_decode_core(state, seq_lens, last_loc, num_reqs):
    """Traceable core of `alloc_decode` (padded inputs; `num_reqs` real requests)."""
    ps = state.page_size
    valid = jnp.arange(seq_lens.shape[0]) < num_reqs
    need_page = valid & ((seq_lens - 1) % ps == 0)  # ps = 1: every token takes a new slot
    num_pages = jnp.sum(need_page)
    full, full_pages = _decode_slots(state.primary, need_page, last_loc, valid, ps)
    swa_last = translate(state, last_loc)
    swa, swa_pages = full, full_pages
    if state.mode is PoolMode.HYBRID:
        swa, swa_pages = _decode_slots(state.swa, need_page, swa_last, valid, ps)
    status = _status(state, num_pages, swa_last, valid & ~need_page)
    state = _commit(state, status, num_pages, full, swa, full_pages, swa_pages)
    return state, AllocResult(status, full, swa)


def _free_swa_core(state, full_slots):
    if state.mode is PoolMode.SINGLE:
        return state
    ps = state.page_size
    pages = jnp.where(full_slots > 0, full_slots // ps, 0)
    if state.mode is PoolMode.ALL_SWA:
        return dataclasses.replace(state, swa=state.swa.push(pages))
    # A full page is paired with exactly one SWA page, so clearing whole full pages frees whole
    # SWA pages. Passing one slot per page is enough (and n / page_size times cheaper).
    expanded = (pages[:, None] * ps + jnp.arange(ps)).reshape(-1)
    swa_slots = state.full_to_swa[expanded]
    return dataclasses.replace(
        state,
        swa=state.swa.push(jnp.where(swa_slots > 0, swa_slots // ps, 0)),
        full_to_swa=state.full_to_swa.at[expanded].set(0),
    )


def _free_core(state, full_slots):
    state = _free_swa_core(state, full_slots)
    if state.mode is PoolMode.ALL_SWA:
        return state
    pages = jnp.where(full_slots > 0, full_slots // state.page_size, 0)
    return dataclasses.replace(state, full=state.full.push(pages))


def release_core(state, swa_slots, full_slots):
    """Traceable: free the SWA pages of `swa_slots`, then the pages of `full_slots`."""
    return _free_core(_free_swa_core(state, swa_slots), full_slots)


def move_swa_core(state, dst, src):
    """Traceable core of `move_swa` (padding: dst = src = 0, which moves nothing)."""
    if state.mode is not PoolMode.HYBRID:
        return state
    moved = state.full_to_swa[src]
    mapping = state.full_to_swa.at[src].set(0).at[dst].set(moved)
    return dataclasses.replace(state, full_to_swa=mapping.at[0].set(0))


_alloc_extend = jax.jit(alloc_extend_core, static_argnames="num_tokens", donate_argnums=0)
_alloc_decode = jax.jit(alloc_decode_core, donate_argnums=0)
_free_swa = jax.jit(_free_swa_core, donate_argnums=0)
_free = jax.jit(_free_core, donate_argnums=0)
_release = jax.jit(release_core, donate_argnums=0)
_move_swa = jax.jit(move_swa_core, donate_argnums=0)


# ---------------------------------------------------------------------------------------------
# Host wrappers: pad to buckets, call the jitted core. Inputs are host integers / numpy arrays.


def alloc_extend(state, prefix_lens, seq_lens, last_loc):
    """Extend request i from prefix_lens[i] to seq_lens[i] tokens (SGLang's paged layout).

    `last_loc[i]` is the full slot of token prefix_lens[i] - 1, or -1 for an empty prefix.
    Returns (state, AllocResult); the result's slots are padded past sum(seq - prefix).
    """
    pre, seq = np.asarray(prefix_lens, np.int32), np.asarray(seq_lens, np.int32)
    if np.any(seq < pre) or np.any(pre < 0):
        raise ValueError(f"need 0 <= prefix_lens <= seq_lens, got {pre.tolist()} / {seq.tolist()}")
    r = bucket(len(pre), MIN_REQ_BUCKET)
    t = bucket(int(np.sum(seq - pre)), MIN_TOKEN_BUCKET)
    return _alloc_extend(state, pad(pre, r), pad(seq, r), pad(last_loc, r, -1), num_tokens=t)


def alloc_decode(state, seq_lens, last_loc):
    """One new token per request; seq_lens include it, last_loc is the slot of token seq - 2."""
    r = bucket(len(seq_lens), MIN_REQ_BUCKET)
    n = np.int32(len(seq_lens))
    return _alloc_decode(state, pad(seq_lens, r), pad(last_loc, r, -1), n)


def alloc(state, num_tokens: int):
    """`num_tokens` fresh slots (a multiple of the page size), as one request with no prefix."""
    if num_tokens % state.page_size:
        raise ValueError(f"alloc of {num_tokens} tokens is not a multiple of {state.page_size}")
    return alloc_extend(state, [0], [num_tokens], [-1])


def free(state, full_slots):
    """Free the full pages holding `full_slots` and, through the mapping, their SWA pages."""
    slots = np.asarray(full_slots, np.int32)
    return _free(state, pad(slots, bucket(len(slots), MIN_TOKEN_BUCKET)))


def free_swa(state, full_slots):
    """Free the SWA pages paired with the full pages holding `full_slots`; idempotent."""
    slots = np.asarray(full_slots, np.int32)
    return _free_swa(state, pad(slots, bucket(len(slots), MIN_TOKEN_BUCKET)))


def release(state, swa_slots, full_slots):
    """`free_swa(swa_slots)` then `free(full_slots)` in one call."""
    swa, full = np.asarray(swa_slots, np.int32), np.asarray(full_slots, np.int32)
    n = bucket(max(len(swa), len(full)), MIN_TOKEN_BUCKET)
    return _release(state, pad(swa, n), pad(full, n))


def move_swa(state, dst_slots, src_slots):
    """Hand the SWA slots of `src_slots` to `dst_slots` (equal length, same in-page offsets).

    Used to revive a cached node whose full KV is locked by other requests: the node keeps its
    full slots and takes over the SWA KV a request has just computed for the same tokens.
    """
    dst, src = np.asarray(dst_slots, np.int32), np.asarray(src_slots, np.int32)
    if dst.shape != src.shape or np.any(dst % state.page_size != src % state.page_size):
        raise ValueError("move_swa needs equally long slot lists with matching in-page offsets")
    n = bucket(len(dst), MIN_TOKEN_BUCKET)
    return _move_swa(state, pad(dst, n), pad(src, n))


# ---------------------------------------------------------------------------------------------
# Host-side invariant check (spec §13 items 1-7), for tests and debugging.


def _free_pages(stack: PageStack, name: str) -> set[int]:
    count, pages = int(stack.count), np.asarray(stack.pages)
    assert 0 <= count <= stack.size, f"{name}: free count {count} outside [0, {stack.size}]"
    free = pages[:count].tolist()
    assert len(set(free)) == count, f"{name}: free list has duplicates"
    assert all(1 <= p <= stack.size for p in free), f"{name}: free page outside 1..{stack.size}"
    flags = set(np.nonzero(np.asarray(stack.is_free))[0].tolist())
    assert flags == set(free), f"{name}: is_free disagrees with the free list"
    return set(free)


def check_invariants(state: AllocatorState) -> None:
    """Raise AssertionError if the state breaks slot conservation, sentinels or pairing."""
    for name in ("full", "swa"):
        if getattr(state, name) is not None:
            _free_pages(getattr(state, name), name)
    if state.mode is not PoolMode.HYBRID:
        return
    ps = state.page_size
    full_free, swa_free = _free_pages(state.full, "full"), _free_pages(state.swa, "swa")
    mapping = np.asarray(state.full_to_swa)
    assert mapping[-1] == -1, "trailing sentinel must stay -1"
    assert not mapping[:ps].any(), "the dummy page must map to 0"
    slots = np.nonzero(mapping[:-1])[0]
    values = mapping[slots]
    assert len(set(values.tolist())) == len(values), "two full slots share an SWA slot"
    assert (values >= ps).all(), "a mapping points into the SWA dummy page"
    assert not (set((slots // ps).tolist()) & full_free), "a free full page is still mapped"
    pairs = {}
    for slot, value in zip(slots.tolist(), values.tolist(), strict=True):
        assert slot % ps == value % ps, f"slot {slot} -> {value} breaks the in-page offset"
        assert pairs.setdefault(slot // ps, value // ps) == value // ps, (
            f"full page {slot // ps} maps into two SWA pages"
        )
    used_swa = set(range(1, state.swa.size + 1)) - swa_free
    assert set(pairs.values()) == used_swa, "allocated SWA pages differ from the mapped ones"
    assert len(pairs) == len(used_swa), "an SWA page is paired with two full pages"
