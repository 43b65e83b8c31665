"""Integer rounding used across the layers (pages, blocks, grids): on Python ints and on numpy
or JAX integer arrays alike."""


def ceil_div(a, b):
    """The smallest integer >= a / b (b > 0)."""
    return -(-a // b)


def round_up(x, multiple):
    """`x` rounded up to a multiple of `multiple` (a page, a block)."""
    return ceil_div(x, multiple) * multiple


def bucket(n: int, minimum: int) -> int:
    """Smallest power of two >= max(n, minimum): batch shapes come from a few sizes only."""
    return max(minimum, 1 << max(0, int(n) - 1).bit_length())
