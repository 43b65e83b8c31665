"""Trace format 3's compact encoding: long integer lists as deltas of lists seen before.

A request's chunks repeat its whole token list (and slot list) in every `match`, `insert` and
`cache_unfinished`, so written plainly a trace grows with the square of the prompt length. Here
every list of at least `MIN_LEN` integers in an encoded field is written either plainly or as
`{"ref": i, "keep": m, "add": [...]}`: the first m values of the i-th encoded list, then `add`.
Every encoded list (plain ones too, once long enough) gets the next id, in file order; both
sides keep the same `CAPACITY` most recently used lists, so a reference never points at a list
the reader has dropped. Candidates are found by the hash of their first `MIN_LEN` values, so
encoding costs one comparison per list that shares that head, not one per list kept.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

MIN_LEN = 32
CAPACITY = 512
# Fields holding long lists, in the order both sides visit them on a line.
FIELDS = (("tokens",), ("node",), ("slots",), ("expect", "slots"), ("expect", "prefix"))


class ListCodec:
    def __init__(self):
        self.table: OrderedDict[int, np.ndarray] = OrderedDict()
        self.heads: dict[bytes, set[int]] = {}
        self.next_id = 0

    def _head(self, arr: np.ndarray) -> bytes:
        return arr[:MIN_LEN].tobytes()

    def _store(self, arr: np.ndarray) -> None:
        i, self.next_id = self.next_id, self.next_id + 1
        self.table[i] = arr
        self.heads.setdefault(self._head(arr), set()).add(i)
        if len(self.table) > CAPACITY:
            old, dropped = self.table.popitem(last=False)
            self.heads[self._head(dropped)].discard(old)

    def _use(self, i: int) -> np.ndarray:
        self.table.move_to_end(i)
        return self.table[i]

    def encode(self, values) -> list[int] | dict:
        arr = np.asarray(values, np.int64).reshape(-1)
        if len(arr) < MIN_LEN:
            return arr.tolist()
        best, keep = None, 0
        for i in self.heads.get(self._head(arr), ()):
            other = self.table[i]
            m = min(len(arr), len(other))
            same = arr[:m] == other[:m]
            k = m if same.all() else int(np.argmin(same))
            if k > keep or (k == keep and best is not None and i > best):
                best, keep = i, k
        if best is not None:
            self._use(best)
        self._store(arr)
        if best is None:
            return arr.tolist()
        return {"ref": best, "keep": keep, "add": arr[keep:].tolist()}

    def decode(self, value, where: str) -> list[int]:
        from swajax.trace.check import TraceError

        if isinstance(value, list):
            if len(value) >= MIN_LEN:
                self._store(np.asarray(value, np.int64))
            return value
        if not isinstance(value, dict) or set(value) != {"ref", "keep", "add"}:
            raise TraceError(f"{where}: a list must be [..] or {{ref, keep, add}}, got {value!r}")
        ref, keep, add = value["ref"], value["keep"], value["add"]
        if ref not in self.table:
            raise TraceError(f"{where}: reference {ref!r} names no list kept by the reader")
        base = self._use(ref)
        if not isinstance(keep, int) or not 0 <= keep <= len(base) or not isinstance(add, list):
            raise TraceError(f"{where}: keep {keep!r} outside list {ref} of {len(base)} values")
        arr = np.concatenate([base[:keep], np.asarray(add, np.int64)])
        self._store(arr)
        return arr.tolist()


def _visit(line: dict, fn) -> None:
    for path in FIELDS:
        holder = line
        for key in path[:-1]:
            holder = holder.get(key) if isinstance(holder, dict) else None
        if isinstance(holder, dict) and path[-1] in holder:
            holder[path[-1]] = fn(holder[path[-1]])


def encode_lines(lines: list[dict]) -> list[dict]:
    codec, out = ListCodec(), []
    for line in lines:
        line = {k: (dict(v) if isinstance(v, dict) else v) for k, v in line.items()}
        _visit(line, lambda v: v if isinstance(v, bool | int) or v is None else codec.encode(v))
        out.append(line)
    return out


def decode_lines(lines: list[dict], source: str) -> list[dict]:
    codec = ListCodec()
    for number, line in enumerate(lines, 2):  # line 1 is the header

        def decode(value, where=f"{source}:{number}"):
            if isinstance(value, bool | int) or value is None:
                return value
            return codec.decode(value, where)

        _visit(line, decode)
    return lines
