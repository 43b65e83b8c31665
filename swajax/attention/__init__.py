"""Paged attention: per-batch metadata and `attention(..., implementation=...)`."""

from swajax.attention.api import (
    AttentionMode as AttentionMode,
    as_pages as as_pages,
    attention as attention,
)
from swajax.attention.mask import picture as picture, visible as visible
from swajax.attention.metadata import (
    AttentionMetadata as AttentionMetadata,
    build_metadata as build_metadata,
)
