"""Compare every number of the stored experiments' result files in two folders.

    python scripts/compare_result_numbers.py OLD_DIR NEW_DIR

For each ``NAME.json`` of ``OLD_DIR``, every leaf of the JSON (numbers, booleans and strings) is
looked up in ``NEW_DIR/NAME.json`` at the same path, its keys mapped through the change of the
schema from version 1 to version 2 (the rules moved under ``rules``:
``tolerance_rule`` -> ``rules/tolerance``, ...; the version itself is not compared). A leaf of
the old file missing from the new one, or different, is printed. Leaves only the new file has
(fields a later version adds: completed configs, null analyses, version 3's ``seal``) are
counted, not judged; a rule's text that changed is printed like any other leaf. Prints how
many numbers were compared; exits 1 if any leaf differs. Independent of fvlib: it reads JSON.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

#: Version 1's top-level keys, as version 2 names them.
RENAMED = {"tolerance_rule": "rules/tolerance", "prefix_rule": "rules/prefix",
           "theory_tolerance_rule": "rules/theory_tolerance", "convergence_rule": "rules/convergence"}


def leaves(tree, path: str = "") -> dict:
    """Every leaf of a JSON tree by its path (``runs/KEY/history/3/eval_stderr``)."""
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in leaves(sub, f"{path}/{key}").items()}
    if isinstance(tree, list):
        return {k: v for i, sub in enumerate(tree) for k, v in leaves(sub, f"{path}/{i}").items()}
    return {path.lstrip("/"): tree}


def new_path(old: str) -> str:
    top, _, rest = old.partition("/")
    return RENAMED.get(top, top) + (f"/{rest}" if rest else "")


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def same(a, b) -> bool:
    """Equal values of the same type (``nan`` equals ``nan``; an int is not a bool)."""
    if is_number(a) and is_number(b):
        return type(a) is type(b) and (a == b or (math.isnan(a) and math.isnan(b)))
    return type(a) is type(b) and a == b


def compare(old_file: Path, new_file: Path) -> tuple[int, int, list[str]]:
    """``(numbers compared, leaves added, differences)`` of one result file."""
    old = leaves(json.loads(old_file.read_text()))
    new = leaves(json.loads(new_file.read_text()))
    old.pop("version", None)
    new.pop("version", None)
    mapped = {new_path(p): (p, v) for p, v in old.items()}
    differences = [f"{old_file.name}: {p}: {v!r} -> " + (repr(new[q]) if q in new else "missing")
                   for q, (p, v) in mapped.items() if q not in new or not same(v, new[q])]
    numbers = sum(is_number(v) for _, v in mapped.values())
    return numbers, len(set(new) - set(mapped)), differences


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    old_dir, new_dir = map(Path, argv)
    files = sorted(old_dir.glob("*.json"))
    if not files:
        print(f"no result files in {old_dir}", file=sys.stderr)
        return 2
    total, differences = 0, []
    for old_file in files:
        new_file = new_dir / old_file.name
        if not new_file.is_file():
            differences.append(f"{old_file.name}: missing in {new_dir}")
            continue
        numbers, added, diffs = compare(old_file, new_file)
        total += numbers
        differences += diffs
        print(f"{old_file.name}: {numbers} numbers compared, {len(diffs)} differ, {added} leaves added")
    for line in differences:
        print(line)
    print(f"{len(files)} files, {total} numbers compared, {len(differences)} differences")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
