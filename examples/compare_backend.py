"""Check another backend's paged attention against swajax's oracle.

    python examples/compare_backend.py

Builds paged pools with swajax's allocator (shuffled pages, freed SWA slots NaN-filled), runs
"the backend under test" (here swajax's own Pallas GPU front end in interpret mode; replace
`backend_under_test` with yours) and reports the worst element against the dense oracle.
"""

import jax.numpy as jnp
import numpy as np

from swajax.attention import as_pages, attention, build_metadata
from swajax.config import LayerKind, LayerSpec
from swajax.conformance.oracle import compare, reference_attention
from swajax.memory import allocator as A, req_to_token as R

PS, W, HQ, HKV, D = 4, 8, 4, 2, 16


def build_case(rng):
    prefix, seq = [0, 20], [30, 21]  # a prefill and a decode
    alloc, r2t = A.init_allocator(256, 256, PS), R.ReqToToken.init(2, 64)
    alloc, res = A.alloc_extend(alloc, [0, 0], seq, [-1, -1])
    r2t = R.write(r2t, [0, 1], [0, 0], seq, res.full_slots)
    k = np.full((256 + PS, HKV, D), np.nan, np.float32)
    v = np.full_like(k, np.nan)
    table = np.asarray(r2t.table)
    for r, n in enumerate(seq):
        swa = np.asarray(A.translate(alloc, table[r, :n]))
        k[swa] = rng.normal(size=(n, HKV, D))
        v[swa] = rng.normal(size=(n, HKV, D))
    meta = build_metadata(r2t, alloc, [0, 1], prefix, seq, window=W)
    q = rng.normal(size=(meta.num_tokens, HQ, D)).astype(np.float32)
    return meta, jnp.asarray(q), as_pages(jnp.asarray(k), PS), as_pages(jnp.asarray(v), PS)


def backend_under_test(q, k, v, meta, layer):
    return attention(q, k, v, meta, layer, scale=D**-0.5, implementation="pallas", interpret=True)


def main():
    meta, q, k, v = build_case(np.random.default_rng(0))
    layer = LayerSpec(LayerKind.SLIDING, W)
    actual = np.asarray(backend_under_test(q, k, v, meta, layer))
    valid = np.asarray(meta.token_valid)
    # The oracle reads the same pools through the SWA page table (logical page j of request r
    # is swa_page_table[r, j - swa_first_page[r]]): rebuild a from-zero table for it.
    first, table = np.asarray(meta.swa_first_page), np.asarray(meta.swa_page_table)
    full_table = np.zeros((table.shape[0], first.max() + table.shape[1]), np.int64)
    for r in range(table.shape[0]):
        full_table[r, first[r] : first[r] + table.shape[1]] = table[r]
    expected = reference_attention(
        np.asarray(q)[valid],
        k,
        v,
        full_table,
        np.asarray(meta.seq_lens),
        np.asarray(meta.token_req)[valid],
        np.asarray(meta.positions)[valid],
        kind="sliding",
        window=W,
        scale=D**-0.5,
    )
    report = compare(actual[valid], expected)
    print(report)
    return report


if __name__ == "__main__":
    main()
