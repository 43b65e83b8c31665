"""Write swajax/foreign_flags.json: every flag of SGLang's `launch_server` and of `vllm serve`,
with its spellings, how many values it takes and its group, read from the two projects' own
argument parsers. Run it once per peer, in an environment where that peer imports:

    .venvs/sglang/bin/python tools/make_launch_flags.py sglang
    VLLM_TARGET_DEVICE=cpu vllm-env/bin/python tools/make_launch_flags.py vllm

(SGLang 0.5.23: tests/peers' venv, ../shared/peers/sglang-setup.sh; vLLM 0.33.0: its wheel
installed without dependencies over that venv, and the modules its import then asks for.)
Each run replaces its peer's half of the file and keeps the other's.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "swajax" / "foreign_flags.json"


def parser_of(peer: str) -> argparse.ArgumentParser:
    if peer == "sglang":
        from sglang.srt.server_args import ServerArgs

        p = argparse.ArgumentParser()
        ServerArgs.add_cli_args(p)
        return p
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    p = FlexibleArgumentParser()
    return make_arg_parser(p)


def arity(action: argparse.Action) -> str:
    """ "0" (a switch), "1", "?", "+" or "*"."""
    if action.nargs == 0:
        return "0"
    return "1" if action.nargs is None else str(action.nargs)


def main() -> None:
    peer = sys.argv[1]
    p = parser_of(peer)
    groups = {id(a): g.title for g in p._action_groups for a in g._group_actions}
    flags = [
        [a.option_strings, arity(a), groups.get(id(a), "")]
        for a in p._actions
        if a.option_strings and "--help" not in a.option_strings
    ]
    table = json.loads(OUT.read_text()) if OUT.exists() else {}
    table[peer] = dict(version=importlib.metadata.version(peer), flags=flags)
    OUT.write_text(json.dumps(table, indent=0, sort_keys=True) + "\n")
    print(f"{peer} {table[peer]['version']}: {len(flags)} flags -> {OUT}")


if __name__ == "__main__":
    main()
