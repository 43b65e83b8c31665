"""The jitted allocator against the plain-Python model, step by step, plus SGLang's scenarios."""

import jax
import numpy as np
import pytest
from helpers.allocator_model import ModelAllocator, draw_extend
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from swajax.memory import allocator as A


def slots(result, n):
    return np.asarray(result.full_slots)[:n].tolist(), np.asarray(result.swa_slots)[:n].tolist()


def free_list(stack):
    """The jitted stack as the model's list: next page to allocate first."""
    return np.asarray(stack.pages)[: int(stack.count)][::-1].tolist()


def assert_same_state(state, model):
    assert free_list(state.primary) == model.full_free
    if state.mode == "hybrid":
        assert free_list(state.swa) == model.swa_free
        mapping = np.asarray(state.full_to_swa)
        expected = np.zeros_like(mapping)
        expected[-1] = -1
        for full, swa in model.mapping.items():
            expected[full] = swa
        np.testing.assert_array_equal(mapping, expected)
    assert tuple(int(x) for x in A.available(state)) == model.available()
    A.check_invariants(state)


class AllocatorMachine(RuleBasedStateMachine):
    """Random extend / decode / free / free_swa on both allocators; small pools run out."""

    @initialize(
        ps=st.sampled_from([1, 4, 16]), mode=st.sampled_from(["hybrid", "hybrid", "single"])
    )
    def setup(self, ps, mode):
        self.ps = ps
        full, swa = 24 * ps, 12 * ps
        self.state = A.init_allocator(full, swa, ps, mode)
        self.model = ModelAllocator(full, swa, ps, mode)
        self.reqs = []  # per request: the full slot of every position

    def _commit(self, result, status, full, swa, targets, lens):
        assert int(result.status) == status
        if status == A.OK:
            assert slots(result, len(full)) == (full, swa)
            start = 0
            for target, n in zip(targets, lens, strict=True):
                target.extend(full[start : start + n])
                start += n

    @rule(data=st.data(), n_new=st.integers(0, 2))
    def extend(self, data, n_new):
        drawn = draw_extend(data, self.reqs, n_new, self.ps)
        if drawn is None:
            return
        targets, extra, pre, seq, last = drawn
        self.state, result = A.alloc_extend(self.state, pre, seq, last)
        status, full, swa = self.model.alloc_extend(pre, seq, last)
        self._commit(result, status, full, swa, targets, extra)
        if status == A.OK:
            self.reqs += targets[len(targets) - n_new :]

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def decode(self, data):
        chosen = data.draw(
            st.lists(st.sampled_from(range(len(self.reqs))), unique=True, min_size=1, max_size=4)
        )
        targets = [self.reqs[i] for i in chosen if self.reqs[i]]
        seq = [len(t) + 1 for t in targets]
        last = [t[-1] for t in targets]
        self.state, result = A.alloc_decode(self.state, seq, last)
        status, full, swa = self.model.alloc_decode(seq, last)
        self._commit(result, status, full, swa, targets, [1] * len(targets))

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def free_swa(self, data):
        req = self.reqs[data.draw(st.integers(0, len(self.reqs) - 1))]
        a = data.draw(st.integers(0, len(req)))
        b = data.draw(st.integers(a, len(req)))
        self.state = A.free_swa(self.state, req[a:b])
        self.model.free_swa(req[a:b])

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def finish(self, data):
        req = self.reqs.pop(data.draw(st.integers(0, len(self.reqs) - 1)))
        self.state = A.free(self.state, req)
        self.model.free(req)

    @invariant()
    def same_state(self):
        if hasattr(self, "state"):
            assert_same_state(self.state, self.model)


TestAllocatorMachine = AllocatorMachine.TestCase
TestAllocatorMachine.settings = __import__("hypothesis").settings(
    max_examples=200, stateful_step_count=25, deadline=None
)


@pytest.mark.slow
class TestAllocatorMachineSlow(AllocatorMachine.TestCase):
    settings = __import__("hypothesis").settings(
        max_examples=10_000, stateful_step_count=40, deadline=None
    )


# ---------------------------------------------------------------------------------------------
# Spec scenarios


def test_paged_free_swa_clears_the_whole_page():
    """§12.1 item 3: ps 4, pools 16/16; free_swa of one slot frees the page, twice is harmless."""
    state = A.init_allocator(16, 16, 4)
    state, result = A.alloc(state, 4)
    full, _ = slots(result, 4)
    assert int(A.available(state).swa) == 12
    state = A.free_swa(state, full[:1])
    assert int(A.available(state).swa) == 16
    assert np.asarray(A.translate(state, np.array(full))).tolist() == [0, 0, 0, 0]
    state = A.free_swa(state, full[1:2])
    assert int(A.available(state).swa) == 16
    state = A.free(state, full)  # frees the full page only: no SWA double free
    assert tuple(int(x) for x in A.available(state)) == (16, 16, 16)
    A.check_invariants(state)


def test_worked_example_layout():
    """§4.3: ps 4, pre 5, seq 14, last_loc 28 -> 29, 30, 31, then page A, then page B."""
    state = A.init_allocator(64, 64, 4)
    state, result = A.alloc(state, 28)  # pages 1..7; slot 28 is page 7 offset 0
    state, result = A.alloc_extend(state, [5], [14], [28])
    full, swa = slots(result, 9)
    assert full[:3] == [29, 30, 31]
    a, b = full[3] // 4, full[7] // 4
    assert full[3:] == [4 * a, 4 * a + 1, 4 * a + 2, 4 * a + 3, 4 * b, 4 * b + 1]
    assert int(A.available(state).full) == 64 - 28 - 8


@pytest.mark.parametrize(
    "ps, full, swa, pre, seq, ok",
    [
        (8, 16, 16, [5, 5], [6, 6], True),  # zero new pages
        (8, 16, 16, [7, 7], [10, 10], True),  # two new pages
        (8, 8, 64, [8] * 5, [9] * 5, False),  # full pool short
        (8, 64, 8, [8] * 5, [9] * 5, False),  # SWA pool short
        (8, 16, 16, [8, 8], [9, 9], True),  # exactly at capacity
        (8, 16, 16, [8] * 3, [9] * 3, False),  # one over
    ]
    + [(ps, 2 * ps, 2 * ps, [ps - 2] * 4, [ps - 1] * 4, True) for ps in (16, 32, 64, 128)],
)
def test_extend_gates_on_new_pages(ps, full, swa, pre, seq, ok):
    """§12.4: gate on exactly sum(ceil(seq/ps) - ceil(pre/ps)) pages in both pools."""
    # Size each pool so that, once every request holds its prefix, the scenario's counts are free.
    used = sum(-(-p // ps) for p in pre) * ps
    state = A.init_allocator(full + used, swa + used, ps)
    state, res = A.alloc_extend(state, [0] * len(pre), pre, [-1] * len(pre))
    assert int(res.status) == A.OK
    prefix = np.asarray(res.full_slots)[: sum(pre)]
    last = [int(prefix[sum(pre[: i + 1]) - 1]) for i in range(len(pre))]
    assert (int(A.available(state).full), int(A.available(state).swa)) == (full, swa)
    before = jax.tree.map(np.asarray, state)
    state, result = A.alloc_extend(state, pre, seq, last)
    assert (int(result.status) == A.OK) == ok
    if not ok:
        jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, state), before)
    A.check_invariants(state)


@pytest.mark.parametrize("full, swa, status", [(8, 16, A.FULL_SHORT), (16, 8, A.SWA_SHORT)])
def test_decode_checks_both_pools(full, swa, status):
    """SGLang's decode path checks only after both allocators ran; here either shortage is clean."""
    state = A.init_allocator(full, swa, 4)
    state, res = A.alloc_extend(state, [0, 0], [4, 4], [-1, -1])  # two pages in each pool
    before = jax.tree.map(np.asarray, state)
    last = np.asarray(res.full_slots)[[3, 7]].tolist()
    state, result = A.alloc_decode(state, [5, 5], last)  # both need a new page
    assert int(result.status) == status
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, state), before)
    state = A.free(state, np.asarray(res.full_slots)[4:8])  # finish the second request
    state, result = A.alloc_decode(state, [5], last[:1])
    assert int(result.status) == A.OK
    A.check_invariants(state)


def test_decode_refuses_a_page_whose_swa_was_freed():
    state = A.init_allocator(16, 16, 4)
    state, res = A.alloc_extend(state, [0], [3], [-1])
    state = A.free_swa(state, np.asarray(res.full_slots)[:1])  # frees the whole (last) page
    state, result = A.alloc_decode(state, [4], [int(res.full_slots[2])])
    assert int(result.status) == A.SWA_LAST_LOC_MISSING


def test_translate_sentinel_and_dummy():
    state = A.init_allocator(8, 8, 1)
    out = np.asarray(A.translate(state, np.array([-1, 0, 3], np.int32))).tolist()
    assert out == [-1, 0, 0]
    assert int(np.asarray(state.full_to_swa)[-1]) == -1


def test_slot_zero_never_handed_out():
    state = A.init_allocator(32, 32, 1)
    state, result = A.alloc(state, 32)
    got = np.asarray(result.full_slots)[:32]
    assert sorted(got.tolist()) == list(range(1, 33))
    state, result = A.alloc(state, 1)
    assert int(result.status) == A.FULL_SHORT


def test_all_swa_mode():
    """No full layers: the SWA pool is the address space; free_swa frees the slots themselves."""
    state = A.init_allocator(0, 16, 4, mode="all_swa")
    state, res = A.alloc_extend(state, [0], [10], [-1])
    full, swa = slots(res, 10)
    assert full == swa and int(A.available(state).swa) == 4
    state = A.free_swa(state, full[:4])
    assert tuple(int(x) for x in A.available(state)) == (8, 8, 8)
    state = A.free(state, full[4:])
    assert int(A.available(state).swa) == 16
    state, res = A.alloc(state, 20)
    assert int(res.status) == A.SWA_SHORT


def test_bad_arguments():
    with pytest.raises(ValueError, match="full_size=10"):
        A.init_allocator(10, 16, 4)
    with pytest.raises(ValueError, match="mode"):
        A.init_allocator(16, 16, 4, mode="dual")
    state = A.init_allocator(16, 16, 4)
    with pytest.raises(ValueError, match="prefix_lens <= seq_lens"):
        A.alloc_extend(state, [5], [3], [-1])
    with pytest.raises(ValueError, match="multiple of 4"):
        A.alloc(state, 3)


def test_compilations_stay_bounded():
    """1,000 calls with varied batch sizes reuse a handful of compiled programs."""
    from swajax.memory.compilations import compilation_count

    rng = np.random.default_rng(0)
    state = A.init_allocator(4096, 4096, 16)
    start = compilation_count()
    live = []
    for _ in range(250):
        n = int(rng.integers(1, 20))
        lens = rng.integers(1, 100, n)
        state, res = A.alloc_extend(state, [0] * n, lens, [-1] * n)
        if int(res.status) != A.OK:
            state = A.free(state, np.concatenate(live))
            live = []
            continue
        flat = np.asarray(res.full_slots)[: lens.sum()]
        ends = np.cumsum(lens)
        live.append(flat)
        state, dec = A.alloc_decode(state, lens + 1, flat[ends - 1])
        live.append(np.asarray(dec.full_slots)[:n])
        state = A.free_swa(state, flat[: int(rng.integers(0, len(flat)))])
        state = A.free(state, live.pop(0)) if len(live) > 3 else state
    compiled = compilation_count() - start
    assert compiled <= 30, compiled
