"""The allocator model with what a host tier needs (claims, pairs, copies), tracking what every
slot holds: each device slot and host page records the token prefix whose KV it stores, so a test
can check that a hit served from the host reads exactly the KV a cold run wrote."""

from __future__ import annotations

from helpers.allocator_model import ModelAllocator


class HostModelAllocator(ModelAllocator):
    def __init__(self, full_size, swa_size, page_size):
        super().__init__(full_size, swa_size, page_size, "hybrid")
        self.full_kv, self.swa_kv = {}, {}  # device slot -> the token prefix its KV is for
        self.host = {"full": {}, "swa": {}}  # host page -> [prefix per token]
        self.copies = {"save": 0, "load": 0}

    def write(self, slots, tokens, start: int) -> None:
        """Positions start.. of `tokens` got their KV at full `slots` (and their SWA slots)."""
        for i, slot in enumerate(slots):
            key = tuple(tokens[: start + i + 1])
            self.full_kv[int(slot)] = key
            swa = self.translate(int(slot))
            if swa > 0:
                self.swa_kv[swa] = key

    def _device(self, pool):
        return self.full_kv if pool == "full" else self.swa_kv

    def _address(self, pool, slot):
        return slot if pool == "full" else self.translate(slot)

    def claim(self, tokens):
        pages = sorted(self.full_free)[: tokens // self.ps]
        assert len(pages) * self.ps == tokens, "claim beyond the free pages"
        for p in pages:
            self.full_free.remove(p)
        return [p * self.ps + o for p in pages for o in range(self.ps)]

    def pair_swa(self, slots):
        pages = sorted({s // self.ps for s in slots})
        assert len(pages) <= len(self.swa_free), "pair beyond the free SWA pages"
        for page in pages:
            assert all(page * self.ps + o not in self.mapping for o in range(self.ps))
            swa = self.swa_free.pop(0)
            for o in range(self.ps):
                self.mapping[page * self.ps + o] = swa * self.ps + o

    def save(self, pool, slots, host_pages):
        self.copies["save"] += 1
        device, slots = self._device(pool), [int(s) for s in slots]
        for k, page in enumerate(host_pages):
            chunk = slots[k * self.ps : (k + 1) * self.ps]
            self.host[pool][int(page)] = [device.get(self._address(pool, s)) for s in chunk]

    def load(self, pool, slots, host_pages):
        self.copies["load"] += 1
        device, slots = self._device(pool), [int(s) for s in slots]
        for k, page in enumerate(host_pages):
            for s, key in zip(slots[k * self.ps : (k + 1) * self.ps], self.host[pool][int(page)]):
                device[self._address(pool, s)] = key
