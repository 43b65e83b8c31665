"""A free list of pages as a device stack (a frozen pytree; pages are numbered from 1).

Beside the stack, `is_free` answers "is page p free?" in O(1), so that a free costs O(n log n)
in the number of pages freed, not O(pool size), and a double free is recognized and ignored.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PageStack:
    pages: jax.Array  # i32[num_pages]: free page ids in [0, count); the top is pages[count - 1]
    count: jax.Array  # i32[]: number of free pages
    is_free: jax.Array  # bool[num_pages + 1]: page p is in pages[:count]; page 0 never is

    @staticmethod
    def init(num_pages: int) -> PageStack:
        """All pages 1..num_pages free, page 1 on top (popped first)."""
        # Built on the host and uploaded: device-side constructors would each compile a program.
        is_free = np.ones(num_pages + 1, bool)
        is_free[0] = False
        return PageStack(
            pages=jnp.asarray(np.arange(num_pages, 0, -1, dtype=np.int32)),
            count=jnp.asarray(np.int32(num_pages)),
            is_free=jnp.asarray(is_free),
        )

    @property
    def size(self) -> int:
        return self.pages.shape[0]

    def peek(self, j: jax.Array) -> jax.Array:
        """The page that the (j+1)-th pop would return (j may be an array; clamped in range)."""
        return self.pages[jnp.clip(self.count - 1 - j, 0, self.size - 1)]

    def pop(self, n: jax.Array, popped: jax.Array) -> PageStack:
        """Take the top n pages; `popped` lists them (repeats and 0 for padding are fine)."""
        # Page 0 (padding) is never free, so marking it taken changes nothing.
        return dataclasses.replace(
            self, count=self.count - n, is_free=self.is_free.at[popped].set(False)
        )

    def push(self, candidates: jax.Array) -> PageStack:
        """Push the candidate pages (i32[n], any order, repeats and 0 allowed) that are in use.

        The lowest page ends on top. Free pages and page 0 are skipped, so a double free is a
        no-op rather than a corrupted list.
        """
        pages = jnp.sort(candidates)
        first = jnp.concatenate([jnp.ones(1, bool), pages[1:] != pages[:-1]])
        keep = first & (pages > 0) & ~self.is_free[pages]
        rank = jnp.cumsum(keep, dtype=jnp.int32) - 1
        # The count read off the ranks' end, not summed again: a separate reduction kept XLA
        # from fusing the ranks' users (18 more kernels per step program).
        k = rank[-1] + 1 if pages.shape[0] else jnp.int32(0)
        dest = jnp.where(keep, self.count + k - 1 - rank, self.size)  # off the end: dropped
        off = self.is_free.shape[0]  # pages not kept mark nothing
        return PageStack(
            pages=self.pages.at[dest].set(pages, mode="drop"),
            count=self.count + k,
            is_free=self.is_free.at[jnp.where(keep, pages, off)].set(True, mode="drop"),
        )

    def claim(self, pages: jax.Array) -> PageStack:
        """Take the given free pages (i32[n], any order, 0 for padding) off the stack, the
        others keeping their order: a host-tier load writes into pages the host chose."""
        is_free = self.is_free.at[pages].set(False)  # page 0 is never free
        keep = (jnp.arange(self.size) < self.count) & is_free[self.pages]
        dest = jnp.where(keep, jnp.cumsum(keep, dtype=jnp.int32) - 1, self.size)
        return PageStack(
            pages=jnp.zeros_like(self.pages).at[dest].set(self.pages, mode="drop"),
            count=jnp.sum(keep, dtype=jnp.int32),
            is_free=is_free,
        )
