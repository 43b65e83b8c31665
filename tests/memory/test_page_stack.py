"""The free-page stack and the row layout of an extend batch against plain-Python models."""

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings, strategies as st

from swajax.memory.padding import token_positions
from swajax.memory.page_stack import PageStack

PAGES = 12
push = jax.jit(PageStack.push)
pop = jax.jit(PageStack.pop)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.booleans(), st.lists(st.integers(0, PAGES), min_size=6, max_size=6)),
        min_size=1,
        max_size=8,
    )
)
def test_push_and_pop_follow_a_list_model(ops):
    """Pushes of candidates with repeats, page 0 and pages already free (a double free is
    ignored; the lowest new page ends on top), pops of the top pages."""
    stack, model = PageStack.init(PAGES), list(range(PAGES, 0, -1))  # model[-1] is the top
    for is_push, values in ops:
        if is_push:
            new = sorted({p for p in values if p > 0 and p not in model})
            model += new[::-1]
            stack = push(stack, jnp.asarray(values, jnp.int32))
        else:
            n = min(values[0] % 4, len(model))
            popped = model[len(model) - n :][::-1]
            del model[len(model) - n :]
            padded = np.zeros(4, np.int32)
            padded[:n] = popped
            assert [int(stack.peek(j)) for j in range(n)] == popped
            stack = pop(stack, jnp.int32(n), jnp.asarray(padded))
        count = int(stack.count)
        assert np.asarray(stack.pages[:count]).tolist() == model
        free = np.asarray(stack.is_free)
        assert not free[0] and sorted(np.flatnonzero(free).tolist()) == sorted(model)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 6)), min_size=1, max_size=5))
def test_token_positions_lay_out_requests_one_after_another(reqs):
    prefix = np.asarray([p for p, _ in reqs], np.int32)
    seq = prefix + np.asarray([n for _, n in reqs], np.int32)
    rows = 32  # at least the 30 tokens five requests can add
    req, pos, valid = jax.jit(token_positions, static_argnums=2)(prefix, seq, rows)
    want = [(i, p) for i, (lo, hi) in enumerate(zip(prefix, seq)) for p in range(lo, hi)]
    assert np.asarray(valid).tolist() == [True] * len(want) + [False] * (rows - len(want))
    got = list(zip(np.asarray(req).tolist(), np.asarray(pos).tolist()))[: len(want)]
    assert got == want
