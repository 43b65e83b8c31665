"""The simplest correct hybrid allocator, written from the spec (§4-§5) with plain lists and dicts.

Free lists are Python lists whose front is allocated first; freed pages are prepended in ascending
order (SGLang's paged allocator). A double free is ignored.
Status codes match swajax.memory.allocator.
"""

OK, FULL_SHORT, SWA_SHORT, SWA_LAST_LOC_MISSING = 0, 1, 2, 3


def ceil_div(a, b):
    return -(-a // b)


class ModelAllocator:
    def __init__(self, full_size, swa_size, page_size, mode="hybrid"):
        self.ps, self.mode = page_size, mode
        one_pool = list(range(1, (swa_size if mode == "all_swa" else full_size) // page_size + 1))
        self.full_free = one_pool
        self.swa_free = list(range(1, swa_size // page_size + 1)) if mode == "hybrid" else None
        self.mapping = {}  # full slot -> SWA slot; absent means 0

    # -- queries
    def translate(self, slot):
        if self.mode != "hybrid" or slot < 0:
            return slot
        return self.mapping.get(slot, 0)

    def available(self):
        full = len(self.full_free) * self.ps
        swa = len(self.swa_free) * self.ps if self.mode == "hybrid" else full
        return full, swa, min(full, swa)

    # -- allocation
    def _check(self, pages, needs_last_slot):
        if pages > len(self.full_free):
            return SWA_SHORT if self.mode == "all_swa" else FULL_SHORT
        if self.mode == "hybrid" and pages > len(self.swa_free):
            return SWA_SHORT
        if any(self.translate(loc) <= 0 for loc in needs_last_slot):
            return SWA_LAST_LOC_MISSING
        return OK

    def _take(self, pages):
        full, self.full_free = self.full_free[:pages], self.full_free[pages:]
        swa = full
        if self.mode == "hybrid":
            swa, self.swa_free = self.swa_free[:pages], self.swa_free[pages:]
        return full, swa

    def _layout(self, pre, seq, last_loc, pages):
        """Part 1: finish the last page; parts 2-3: fill new pages from offset 0."""
        ps = self.ps
        n1 = min(seq, ceil_div(pre, ps) * ps) - pre
        slots = [last_loc + 1 + i for i in range(n1)]
        remaining = seq - pre - n1
        for page in pages:
            take = min(ps, remaining)
            slots += [page * ps + offset for offset in range(take)]
            remaining -= take
        assert remaining == 0
        return slots

    def _pair(self, full, swa):
        if self.mode == "hybrid":
            for f, s in zip(full, swa, strict=True):
                self.mapping[f] = s

    def alloc_extend(self, prefix_lens, seq_lens, last_loc):
        per_req = [
            ceil_div(s, self.ps) - ceil_div(p, self.ps) for p, s in zip(prefix_lens, seq_lens)
        ]
        tails = [loc for p, s, loc in zip(prefix_lens, seq_lens, last_loc) if p % self.ps and s > p]
        status = self._check(sum(per_req), tails)
        if status != OK:
            return status, [], []
        full_pages, swa_pages = self._take(sum(per_req))
        full, swa, start = [], [], 0
        for pre, seq, loc, n in zip(prefix_lens, seq_lens, last_loc, per_req):
            full += self._layout(pre, seq, loc, full_pages[start : start + n])
            swa += self._layout(pre, seq, self.translate(loc), swa_pages[start : start + n])
            start += n
        self._pair(full, swa)
        return OK, full, swa

    def alloc_decode(self, seq_lens, last_loc):
        need = [self.ps == 1 or seq % self.ps == 1 for seq in seq_lens]
        tails = [loc for loc, n in zip(last_loc, need) if not n]
        status = self._check(sum(need), tails)
        if status != OK:
            return status, [], []
        full_pages, swa_pages = self._take(sum(need))
        full, swa, k = [], [], 0
        for loc, new_page in zip(last_loc, need):
            if new_page:
                full.append(full_pages[k] * self.ps)
                swa.append(swa_pages[k] * self.ps)
                k += 1
            else:
                full.append(loc + 1)
                swa.append(self.translate(loc) + 1)
        self._pair(full, swa)
        return OK, full, swa

    # -- release
    @staticmethod
    def _release(free_list, pages):
        fresh = sorted({p for p in pages if p > 0} - set(free_list))
        free_list[:0] = fresh

    def _used_pages(self, free_list, slots):
        return {s // self.ps for s in slots if s > 0} - set(free_list)

    def free_swa(self, slots):
        if self.mode == "single":
            return
        if self.mode == "all_swa":
            self._release(self.full_free, self._used_pages(self.full_free, slots))
            return
        pages = {s // self.ps for s in slots if s > 0}
        expanded = [p * self.ps + o for p in pages for o in range(self.ps)]
        swa = [self.mapping.pop(f) for f in expanded if f in self.mapping]
        self._release(self.swa_free, {s // self.ps for s in swa})

    def free(self, slots):
        self.free_swa(slots)
        if self.mode != "all_swa":
            self._release(self.full_free, self._used_pages(self.full_free, slots))

    def move_swa(self, dst, src):
        if self.mode != "hybrid":
            return
        moved = [self.mapping.pop(s, 0) for s in src]
        for d, m in zip(dst, moved):
            if m:
                self.mapping[d] = m
            else:
                self.mapping.pop(d, None)


def draw_extend(data, reqs, n_new, ps):
    """A random extend for the allocator state machines: up to two running requests (each a
    list of its slots) and `n_new` new ones (last), 1 to 3 pages' worth of tokens each. Returns
    (targets, tokens each, prefix_lens, seq_lens, last_loc), or None when there is nothing to
    extend."""
    from hypothesis import strategies as st

    existing = (
        data.draw(st.lists(st.sampled_from(range(len(reqs))), unique=True, max_size=2))
        if reqs
        else []
    )
    targets = [reqs[i] for i in existing] + [[] for _ in range(n_new)]
    if not targets:
        return None
    extra = [data.draw(st.integers(1, 3 * ps)) for _ in targets]
    pre = [len(t) for t in targets]
    seq = [p + e for p, e in zip(pre, extra)]
    last = [t[-1] if t else -1 for t in targets]
    return targets, extra, pre, seq, last
