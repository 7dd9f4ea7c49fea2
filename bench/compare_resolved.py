"""Compare every resolved record and bucket value of two spec trees, e.g. before and after a
change to the compiler or the specs (instantiation names compared as vendor + value digest).

    python -m codegen show --json > /tmp/after.json
    (cd OLD_CHECKOUT && PYTHONPATH=. python -m codegen show --json) > /tmp/before.json
    python bench/compare_resolved.py /tmp/before.json /tmp/after.json

Prints NEW / GONE for (config, variant, model, target) present on one side only, DIFF with the
fields whose values differ, NAME where an instantiation's digest differs, and a count.  Exit 1
if anything differs, 2 on an unreadable input (the file and what is wrong, no traceback); a reader
that leaves early (`... | head`) ends it quietly."""

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from policy_runtime.report import quiet_on_closed_pipe  # noqa: E402


def flat(tree: dict) -> dict:
    out = {}
    for cname, cfg in tree["configs"].items():
        for vname, v in cfg["variants"].items():
            for model, targets in v["models"].items():
                for target, r in targets.items():
                    rec = {k: x for k, x in r.items() if k not in ("instantiation", "policy_line", "tuned", "policy")}
                    out[(cname, vname, model, target)] = (rec, r.get("instantiation"))
    return out


def load(path: str) -> dict:
    """The flattened records of one `codegen show --json` file; where it cannot be read as one,
    the file and the problem on stderr and exit 2."""
    try:
        with open(path) as f:
            return flat(json.load(f))
    except OSError as e:
        problem = e.strerror
    except json.JSONDecodeError as e:
        path, problem = f"{path}:{e.lineno}", f"not JSON ({e.msg})"
    except (KeyError, AttributeError, TypeError) as e:
        problem = f"not `codegen show --json` output (no {e})"
    print(f"compare_resolved: {path}: {problem}", file=sys.stderr)
    sys.exit(2)


def main(before_path: str, after_path: str) -> int:
    before, after = load(before_path), load(after_path)
    compared = differ = 0
    for key in sorted(set(before) | set(after), key=str):
        if key not in before or key not in after:
            print("NEW" if key not in before else "GONE", key)
            differ += 1
            continue
        compared += 1
        (ra, ia), (rb, ib) = before[key], after[key]
        if ra != rb:
            differ += 1
            print("DIFF", key, {f: (ra.get(f), rb.get(f)) for f in sorted(set(ra) | set(rb)) if ra.get(f) != rb.get(f)})
        # Names were "<vendor><lowest arch>_<digest>" before 2026-12; now "<vendor>_<digest>".
        if ia and ib and re.sub(r"^([a-z]+)\d*_", r"\1_", ia) != re.sub(r"^([a-z]+)\d*_", r"\1_", ib):
            print("NAME", key, ia, ib)
    print(f"{compared} records compared, {differ} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before", help="codegen show --json of the old tree")
    ap.add_argument("after", help="codegen show --json of the new tree")
    args = ap.parse_args()
    sys.exit(quiet_on_closed_pipe(lambda: main(args.before, args.after)))
