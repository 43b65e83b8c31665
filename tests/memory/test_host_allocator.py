"""The host allocator (numpy, the null model's) against the jitted device allocator: the same
operations give the same statuses, the same slots and the same stacks, page for page."""

import jax
import numpy as np
import pytest
from helpers.allocator_model import draw_extend
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from swajax.arith import bucket
from swajax.memory import allocator as A
from swajax.memory.host_allocator import HostAllocator
from swajax.memory.host_copy import claim_pages
from swajax.memory.padding import pad

CLAIM = jax.jit(claim_pages)


def stack_of(stack):
    """(free pages bottom first, the whole page array, is_free) of a device or host stack: past
    the free count too, where a failed allocation's peeks read."""
    pages = np.asarray(stack.pages)
    return pages[: int(stack.count)].tolist(), pages.tolist(), np.asarray(stack.is_free).tolist()


def assert_same(state: A.AllocatorState, host: HostAllocator):
    for name in ("full", "swa"):
        dev, mine = getattr(state, name), getattr(host, name)
        assert (dev is None) == (mine is None), name
        if dev is not None:
            assert stack_of(dev) == stack_of(mine), name
    if host.full_to_swa is not None:
        np.testing.assert_array_equal(np.asarray(state.full_to_swa), host.full_to_swa)
    assert tuple(int(x) for x in A.available(state))[:2] == host.available()


class HostAgainstDevice(RuleBasedStateMachine):
    """Random extends, decodes, releases (SWA and full), SWA moves and host-tier loads on both;
    small pools run out, so failures are compared too."""

    @initialize(
        ps=st.sampled_from([1, 4, 16]),
        mode=st.sampled_from(["hybrid", "hybrid", "hybrid", "single", "all_swa"]),
    )
    def setup(self, ps, mode):
        self.ps, self.mode = ps, mode
        full, swa = 24 * ps, 12 * ps
        self.state = A.init_allocator(full, swa, ps, mode)
        self.host = HostAllocator(full, swa, ps, mode)
        self.reqs = []  # per request: the full slot of every position
        self.swa_freed = set()  # full pages whose SWA was released (hybrid)

    def _record(self, status, slots, targets, lens):
        if status != A.OK:
            return
        start = 0
        for target, n in zip(targets, lens, strict=True):
            target.extend(slots[start : start + n].tolist())
            start += n

    @rule(data=st.data(), n_new=st.integers(0, 2))
    def extend(self, data, n_new):
        drawn = draw_extend(data, self.reqs, n_new, self.ps)
        if drawn is None:
            return
        targets, extra, pre, seq, last = drawn
        self.state, result = A.alloc_extend(self.state, pre, seq, last)
        status, slots = self.host.alloc_extend(pre, seq, last)
        assert int(result.status) == status
        n = sum(extra)
        np.testing.assert_array_equal(np.asarray(result.full_slots)[:n], slots)
        self._record(status, slots, targets, extra)
        if status == A.OK:
            self.reqs += targets[len(targets) - n_new :]

    @precondition(lambda self: any(self.reqs))
    @rule(data=st.data())
    def decode(self, data):
        chosen = data.draw(
            st.lists(st.sampled_from(range(len(self.reqs))), unique=True, min_size=1, max_size=4)
        )
        targets = [self.reqs[i] for i in chosen if self.reqs[i]]
        if not targets:
            return
        seq = [len(t) + 1 for t in targets]
        last = [t[-1] for t in targets]
        self.state, result = A.alloc_decode(self.state, seq, last)
        status, slots = self.host.alloc_decode(seq, last)
        assert int(result.status) == status
        np.testing.assert_array_equal(np.asarray(result.full_slots)[: len(seq)], slots)
        self._record(status, slots, targets, [1] * len(targets))

    @precondition(lambda self: self.reqs)
    @rule(data=st.data(), whole=st.booleans())
    def release(self, data, whole):
        """An SWA release of a range (possibly repeated: idempotent), and maybe a request's
        full release, in one call (SWA first, as the device does)."""
        req = self.reqs[data.draw(st.integers(0, len(self.reqs) - 1))]
        a = data.draw(st.integers(0, len(req)))
        b = data.draw(st.integers(a, len(req)))
        swa = req[a:b]
        full = self.reqs.pop(data.draw(st.integers(0, len(self.reqs) - 1))) if whole else []
        if self.mode == "all_swa" and full:
            swa = [s for s in swa if s not in set(full)]  # never evict and free the same slot
            full_pages = {s // self.ps for s in full}
            swa = [s for s in swa if s // self.ps not in full_pages]
        self.state = A.release(self.state, swa, full)
        self.host.release(swa, full)
        if self.mode == "all_swa":  # an evicted slot is gone for good: its request stops
            gone = {s // self.ps for s in swa}
            self.reqs = [r for r in self.reqs if not gone & {s // self.ps for s in r}]
        self.swa_freed |= {s // self.ps for s in swa}
        self.swa_freed -= {s // self.ps for s in full}

    @precondition(lambda self: self.mode == "hybrid" and self.reqs)
    @rule(data=st.data())
    def move_swa(self, data):
        """A whole page's SWA handed to a page whose SWA was freed (a revived cache node)."""
        mapping = self.host.full_to_swa
        owned = sorted({s // self.ps for r in self.reqs for s in r})
        src = [p for p in owned if mapping[p * self.ps] > 0]
        dst = [p for p in owned if p in self.swa_freed and mapping[p * self.ps] == 0]
        if not src or not dst:
            return
        s, d = data.draw(st.sampled_from(src)), data.draw(st.sampled_from(dst))
        src_slots = np.arange(s * self.ps, (s + 1) * self.ps)
        dst_slots = np.arange(d * self.ps, (d + 1) * self.ps)
        self.state = A.move_swa(self.state, dst_slots, src_slots)
        self.host.move_swa(dst_slots, src_slots)
        self.swa_freed = (self.swa_freed - {d}) | {s}

    @precondition(lambda self: self.mode == "hybrid")
    @rule(data=st.data())
    def load(self, data):
        """A host-tier load: free full pages the host chose, some of them paired with SWA."""
        free = stack_of(self.host.full)[0]
        if not free:
            return
        chosen = data.draw(st.lists(st.sampled_from(free), unique=True, min_size=1, max_size=4))
        paired = [p for p in chosen if data.draw(st.booleans())]
        paired = paired[: self.host.swa.count]
        n = bucket(len(chosen), 4)
        self.state = CLAIM(self.state, pad(chosen, n), pad(paired, n))
        self.host.claim(chosen)
        self.host.pair(paired)
        for p in chosen:
            self.reqs.append(list(range(p * self.ps, (p + 1) * self.ps)))
            if p not in paired:
                self.swa_freed.add(p)

    @invariant()
    def same_state(self):
        if hasattr(self, "state"):
            assert_same(self.state, self.host)
            A.check_invariants(self.host.as_state())


TestHostAgainstDevice = HostAgainstDevice.TestCase
TestHostAgainstDevice.settings = settings(max_examples=120, stateful_step_count=25, deadline=None)


@pytest.mark.slow
class TestHostAgainstDeviceSlow(HostAgainstDevice.TestCase):
    settings = settings(max_examples=3_000, stateful_step_count=40, deadline=None)
