"""Replay swajax traces through SGLang 0.5.23 (run with the SGLang environment's python):

    .venvs/sglang/bin/python tests/peers/replay_in_sglang.py TRACE.jsonl[.gz] ...

One JSON line per trace: {"trace": path, "ok": true, "ops": n} or the first divergence as
`swajax.trace.replay.replay` reports it (operation number, op, fields, expected, actual), or
{"trace": path, "ok": false, "error": "..."} if SGLang raised.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]
warnings.filterwarnings("ignore")

from sglang_adapter import SGLangAdapter  # noqa: E402

from swajax.trace.replay import replay  # noqa: E402


def main(paths: list[str]) -> int:
    adapter = SGLangAdapter()
    failed = 0
    for path in paths:
        try:
            result = replay(path, backend=adapter.allocator_and_cache)
        except Exception as e:  # noqa: BLE001 - SGLang's assertion is that trace's result
            result = dict(ok=False, error=f"{type(e).__name__}: {e}")
        failed += not result["ok"]
        print(json.dumps(dict(trace=path, **result)), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
