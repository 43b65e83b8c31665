"""The kernels' value checks beside their shape checks: `dynamic_validate` names the first bad
value of a table (on the host, outside jit) and passes well-formed ones."""

import numpy as np
import pytest

from swajax.kernels import paged_decode as pd, ragged_extend as re_

POOL = np.zeros((20, 4, 2, 16), np.float32)  # 20 pages of 4 tokens


def test_decode_inputs_pass_and_bad_values_are_named():
    table, first, seqs = np.array([[1, 2, 3], [4, 5, 6]]), np.array([0, 2]), np.array([12, 17])
    pd.dynamic_validate(POOL, table, first, seqs)
    bad = {
        "page_table": (np.array([[1, 2, 3], [4, 20, 6]]), first, seqs, r"page_table\[1, 1\] = 20"),
        "first_page": (table, np.array([0, -1]), seqs, r"first_page\[1\] = -1 must be >= 0"),
        "seq_lens": (table, first, np.array([13, 17]), r"seq_lens\[0\] = 13 must be within"),
    }
    for table_, first_, seqs_, match in bad.values():
        with pytest.raises(ValueError, match=match):
            pd.dynamic_validate(POOL, table_, first_, seqs_)


def test_extend_inputs_pass_and_bad_values_are_named():
    table, first = np.array([[1, 2, 3], [4, 5, 6]]), np.array([0, 1])
    req, pos, n = np.array([0, 1, 1]), np.array([0, 4, 12]), np.array([8, 8, 3])
    re_.dynamic_validate(POOL, table, first, req, pos, n, block_q=8)
    cases = [
        ((table, first, np.array([0, 2, 1]), pos, n), r"block_req\[1\] = 2 must be a table row"),
        ((table, first, req, pos, np.array([8, 9, 3])), r"block_len\[1\] = 9 must be in \[0, 8\]"),
        ((table, first, req, np.array([0, 4, 20]), n), r"block_pos\[2\] = 20 must be within"),
        ((table, first, req, np.array([0, -4, 12]), n), r"block_pos\[1\] = -4 must be >= 0"),
    ]
    for args, match in cases:
        with pytest.raises(ValueError, match=match):
            re_.dynamic_validate(POOL, *args, block_q=8)
