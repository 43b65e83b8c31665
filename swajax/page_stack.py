"""A free list of pages as a device stack (a frozen pytree; pages are numbered from 1)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PageStack:
    pages: jax.Array  # i32[num_pages]: free page ids in [0, count); the top is pages[count - 1]
    count: jax.Array  # i32[]: number of free pages

    @staticmethod
    def init(num_pages: int) -> PageStack:
        """All pages 1..num_pages free, page 1 on top (popped first)."""
        return PageStack(jnp.arange(num_pages, 0, -1, dtype=jnp.int32), jnp.int32(num_pages))

    @property
    def size(self) -> int:
        return self.pages.shape[0]

    def peek(self, j: jax.Array) -> jax.Array:
        """The page that the (j+1)-th pop would return (j may be an array; clamped in range)."""
        return self.pages[jnp.clip(self.count - 1 - j, 0, self.size - 1)]

    def pop(self, n: jax.Array) -> PageStack:
        return dataclasses.replace(self, count=self.count - n)

    def free_mask(self) -> jax.Array:
        """bool[num_pages + 1]: which pages are free (index 0, the dummy page, is False)."""
        live = jnp.arange(self.size) < self.count
        return jnp.zeros(self.size + 1, bool).at[jnp.where(live, self.pages, 0)].set(live)

    def push(self, marks: jax.Array) -> PageStack:
        """Push the marked pages (bool[num_pages + 1]) that are not free already.

        The lowest page ends on top. Marks of free pages and of page 0 are ignored, so a double
        free is a no-op rather than a corrupted list.
        """
        freed = marks & ~self.free_mask()
        freed = freed.at[0].set(False)
        k = jnp.sum(freed, dtype=jnp.int32)
        dest = jnp.where(
            freed, self.count + k - 1 - (jnp.cumsum(freed, dtype=jnp.int32) - 1), self.size
        )
        ids = jnp.arange(self.size + 1, dtype=jnp.int32)
        pages = self.pages.at[dest].set(ids, mode="drop")
        return PageStack(pages, self.count + k)
