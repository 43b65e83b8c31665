"""req_to_token: ragged row writes, padding, last_loc, and translation through the allocator."""

import numpy as np
import pytest

from swajax.memory import allocator as A, req_to_token as R


def test_extend_writes_rows_and_last_loc():
    state = A.init_allocator(64, 64, 4)
    r2t = R.ReqToToken.init(4, 32)
    state, res = A.alloc_extend(state, [0, 0], [5, 3], [-1, -1])
    r2t = R.write(r2t, [2, 0], [0, 0], [5, 3], res.full_slots)
    flat = np.asarray(res.full_slots)[:8]
    table = np.asarray(r2t.table)
    np.testing.assert_array_equal(table[2, :5], flat[:5])
    np.testing.assert_array_equal(table[0, :3], flat[5:])
    assert not table[1].any() and not table[3].any() and not table[2, 5:].any()
    last = R.last_loc(r2t, np.array([2, 0, 1]), np.array([5, 3, 0]))
    assert np.asarray(last).tolist() == [flat[4], flat[7], -1]
    # Continue request 2 from its prefix: positions 5..9 go after the existing ones.
    state, res2 = A.alloc_extend(state, [5], [10], [int(last[0])])
    r2t = R.write(r2t, [2], [5], [10], res2.full_slots)
    row = np.asarray(r2t.table)[2, :10]
    assert (row[:8] % 4 == np.arange(8) % 4).all()  # position p at in-page offset p % ps
    swa = np.asarray(A.translate(state, row))
    assert (swa > 0).all() and len(set(swa.tolist())) == 10


def test_context_limit():
    r2t = R.ReqToToken.init(2, 8)
    with pytest.raises(ValueError, match="exceeds max_context 8"):
        R.write(r2t, [0], [0], [9], np.zeros(9, np.int32))
    with pytest.raises(ValueError, match="0 x 8"):
        R.ReqToToken.init(0, 8)
