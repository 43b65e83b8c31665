"""Which keys a query sees: `swajax.kernels.common` holds the one definition; this adapts it.

A query at absolute position q sees key position k iff k <= q and
  full:     always
  sliding:  k >= q - W          (W + 1 keys: W before the query, and the query itself)
  chunked:  k >= floor(q / C) * C   (Llama 4: only the query's own chunk)
"""

from __future__ import annotations

from swajax.config import LayerSpec
from swajax.kernels import common


def window_start(q_pos, layer: LayerSpec):
    """First key position visible from query position `q_pos` (array or int; >= 0)."""
    return common.window_lo(q_pos, layer.kind.value, layer.kernel_window)


def visible(q_pos, k_pos, layer: LayerSpec):
    """bool: query at q_pos sees the key at k_pos (broadcasting)."""
    return common.visible(q_pos, k_pos, layer.kind.value, layer.kernel_window)


def lookback(layer: LayerSpec) -> int | None:
    """The most tokens before a query that the layer can read (None: unbounded)."""
    return common.lookback(layer.kind.value, layer.kernel_window)


def picture(n: int, layer: LayerSpec) -> list[str]:
    """Rows of '1'/'.' for queries 0..n-1 over keys 0..n-1 (for tests and docs)."""
    return ["".join("1" if bool(visible(q, k, layer)) else "." for k in range(n)) for q in range(n)]
