"""`swajax conformance export DIR` and `swajax conformance run --adapter MODULE:CLASS DIR`."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from swajax.cli import args as args_lib


def _run_export(args) -> int:
    from swajax.conformance.kit import export

    folder = Path(args.folder)
    if folder.exists() and any(folder.iterdir()) and not args.force:
        raise args_lib.UsageError(f"{folder} exists and is not empty (use --force)")
    for model in args.models:
        if not (Path(model) / "greedy.json").exists() or not (Path(model) / "logits.npy").exists():
            raise args_lib.UsageError(
                f"--models {model}: needs greedy.json (the prompt) and logits.npy (expected), "
                "as tools/make_fixtures.py writes them"
            )
    manifest = export(folder, models=tuple(args.models), cache_policy=args.cache_policy)
    print(f"wrote {len(manifest['cases'])} cases to {folder} ({args.cache_policy} rules)")
    return 0


def _run_kit(args) -> int:
    from swajax.cli.args import load_object
    from swajax.conformance.kit import run

    adapter = load_object(args.adapter, "--adapter")()
    try:
        results = run(args.folder, adapter)
    except ValueError as e:
        raise args_lib.UsageError(str(e)) from e
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in results]))
    else:
        for r in results:
            print(f"{r.status.upper():8} {r.kind:10} {r.name:32} {r.detail}")
        counts = {s: sum(r.status == s for r in results) for s in ("ok", "fail", "skipped")}
        print(f"{counts['ok']} ok, {counts['fail']} failed, {counts['skipped']} skipped")
    return 1 if any(r.status == "fail" for r in results) else 0


def register(sub) -> None:
    from swajax.prefix_cache.policy import DEFAULT, PROFILES

    p = sub.add_parser("conformance", help="golden cases for other backends: export, run")
    kit = p.add_subparsers(dest="conformance_command", required=True)
    e = kit.add_parser("export", help="write the kit's cases to a folder")
    e.add_argument("folder", metavar="DIR")
    e.add_argument(
        "--models",
        nargs="*",
        default=[],
        metavar="DIR",
        help="checkpoint folders with greedy.json + logits.npy (transformers' "
        "logits) to add as logits cases",
    )
    e.add_argument("--force", action="store_true", help="write into a non-empty folder")
    e.add_argument(
        "--cache-policy",
        choices=sorted(PROFILES),
        default=DEFAULT,
        help="prefix-cache rules the operation cases are recorded under",
    )
    e.set_defaults(func=_run_export)
    r = kit.add_parser("run", help="drive an adapter through every case; report per case")
    r.add_argument("folder", metavar="DIR")
    r.add_argument(
        "--adapter",
        required=True,
        metavar="MODULE:CLASS",
        help="e.g. swajax.conformance.adapter:SwajaxAdapter",
    )
    r.add_argument("--json", action="store_true")
    r.set_defaults(func=_run_kit)
