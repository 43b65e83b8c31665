"""Whether the computation being traced splits its weights over devices (tensor parallelism):
a trace-time switch the model's forward sets from its mesh (`decoder.traced`), as
`invariant.batch_invariant` is.

On CPU some products read a weight a cache-sized chunk at a time, by dynamic slices along one
axis (`layers.dot`, `layer_stack`'s stacked kernels, `experts.expert_product`). A dynamic slice
along an axis split over devices gathers the whole axis onto every device, so where the weights
are split those products read them whole instead (or chunk them along an axis never split)."""

from __future__ import annotations

import contextlib
import contextvars

from swajax.switch import switched

_SPLIT = contextvars.ContextVar("tensor_split", default=False)


def split_over_devices(split: bool) -> contextlib.AbstractContextManager[None]:
    """Trace what runs inside with the weights split over devices or not."""
    return switched(_SPLIT, split)


def on() -> bool:
    """Whether the weights are split over devices in what is being traced."""
    return _SPLIT.get()
