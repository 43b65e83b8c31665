"""Check a backend's answers against a conformance kit's operation cases, with no swajax code:
the protocol is in swajax/conformance/protocol.py, the schema in the kit's ops.schema.json.

    python examples/kit_checker.py KIT_DIR ANSWERS_DIR

ANSWERS_DIR/NAME.jsonl holds one JSON object per operation line of KIT_DIR/ops/NAME.jsonl: the
backend's answer (the keys of that line's `expect`), slots in the backend's own numbering.
Prints one line per case (SKIP where no answers file was written) and exits 1 if any differs.
Written from the protocol alone (the standard library only), as a backend in another language
would write it.
"""

import json
import sys
from pathlib import Path


class Pages:
    """The page bijection: recorded page <-> the backend's page, paired at allocation."""

    def __init__(self, page_size):
        self.ps, self.fwd, self.back = page_size, {}, {}

    def pair(self, recorded, actual):
        if len(recorded) != len(actual):
            return f"{len(actual)} slots allocated, {len(recorded)} expected"
        for r, a in zip(recorded, actual):
            if r % self.ps != a % self.ps:
                return f"slot {a} at page offset {a % self.ps}, expected offset {r % self.ps}"
            rp, ap = r // self.ps, a // self.ps
            if r % self.ps == 0:
                self.back.pop(self.fwd.pop(rp, None), None)
                self.fwd.pop(self.back.pop(ap, None), None)
                self.fwd[rp], self.back[ap] = ap, rp
            elif self.fwd.get(rp) != ap:
                return f"slot {a} does not continue the page paired with recorded page {rp}"
        return None

    def same(self, recorded, actual):
        if len(recorded) != len(actual):
            return False
        for r, a in zip(recorded, actual):
            if r <= 0 or a <= 0:
                if r != a:
                    return False
            elif self.fwd.get(r // self.ps) != a // self.ps or r % self.ps != a % self.ps:
                return False
        return True


def check_case(case_path, answers_path):
    lines = [json.loads(x) for x in Path(case_path).read_text().splitlines() if x.strip()]
    header, ops = lines[0], lines[1:-1]
    answers = [json.loads(x) for x in Path(answers_path).read_text().splitlines() if x.strip()]
    pages = Pages(header["page_size"])
    for number, (line, answer) in enumerate(zip(ops, answers), 1):
        expect = line["expect"]
        if line["op"] in ("alloc_extend", "alloc_decode") and expect["status"] == 0:
            if answer.get("status") == 0:
                problem = pages.pair(expect["slots"], answer.get("slots", []))
                if problem:
                    return f"operation {number} ({line['op']}) [slots]: {problem}"
        wrong = [
            key
            for key in expect
            if not (
                pages.same(expect[key], answer.get(key, []))
                if key in ("slots", "prefix")
                else expect[key] == answer.get(key)
            )
        ]
        if wrong:
            detail = {key: (expect[key], answer.get(key)) for key in wrong}
            return f"operation {number} ({line['op']}) [{', '.join(wrong)}]: {detail}"
    if len(answers) < len(ops):
        return f"{len(answers)} answers for {len(ops)} operations"
    return None


def main(kit, answers):
    manifest = json.loads((Path(kit) / "manifest.json").read_text())
    failed = 0
    for case in manifest["cases"]:
        if case["kind"] != "ops":
            continue
        answered = Path(answers) / f"{case['name']}.jsonl"
        if not answered.exists():  # a backend that declined the case (e.g. a pool mode)
            print(f"{'SKIP':5} {case['name']:36} no answers")
            continue
        problem = check_case(Path(kit) / case["path"], answered)
        failed += problem is not None
        print(f"{'FAIL' if problem else 'OK':5} {case['name']:36} {problem or ''}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
