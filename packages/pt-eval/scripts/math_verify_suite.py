"""Math-Verify's public test suite as a development set for pt-eval.

    uv run --no-sync python packages/pt-eval/scripts/math_verify_suite.py [--show all|diff]

Math-Verify's source distribution ships its tests. This script downloads that sdist for
the installed Math-Verify version (``pip download --no-binary :all: --no-deps``) into a
temporary directory, reads the test files with ``ast`` (nothing in them is imported or
run), and pulls out every labelled (gold, prediction, expected) pair with the options its
test passes. Each pair is then graded by pt-eval the way ``pt-eval grade`` grades a row:
the gold through ``gold_answer``, the prediction through ``extract_answer``, both compared
in the worker pool. The last stdout line is one JSON object with the agreement.

Options map to pt-eval's as follows: an explicit ``precision=p`` (Math-Verify rounds
both sides to p decimals) becomes ``numeric_tolerance=10**-p``; Math-Verify's default
precision is left to pt-eval's default policy (a decimal is judged at the precision it
is written with). ``match_types`` without ``"expr"`` (no plain-number extraction) becomes
``last_number=False``. ``strict=False`` (variable names ignored) and
``allow_set_relation_comp`` have no pt-eval counterpart; they are reported with the case.

The files downloaded are not kept; pass ``--sdist PATH`` to use a local copy.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import shutil
import subprocess
import sys
import tarfile
import tempfile
from importlib import metadata
from pathlib import Path

LABEL_NAMES = ("expected", "result")


def download_sdist(version: str, into: Path) -> Path:
    """The Math-Verify sdist for ``version``, fetched with pip into ``into``."""
    spec = f"math-verify=={version}"
    pips = [[sys.executable, "-m", "pip"]] + [[p] for p in ("pip3", "pip") if shutil.which(p)]
    errors = []
    for pip in pips:
        proc = subprocess.run(
            [*pip, "download", "--no-binary", ":all:", "--no-deps", "-q", spec, "-d", str(into)],
            capture_output=True,
            text=True,
        )
        if proc.returncode == 0:
            found = sorted(into.glob("math_verify-*.tar.gz"))
            if found:
                return found[0]
        errors.append(
            f"{' '.join(pip)}: {proc.stderr.strip().splitlines()[-1:] or proc.returncode}"
        )
    sys.exit("could not download the Math-Verify sdist:\n  " + "\n  ".join(errors))


def test_files(sdist: Path, into: Path) -> list[Path]:
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if "/tests/" in m.name and m.name.endswith(".py")]
        tar.extractall(into, members=members, filter="data")
    return sorted(into.glob("*/tests/test_*.py"))


# --------------------------------------------------------------------------- reading tests


def literal(node: ast.AST):
    """A constant from the test source; f-strings of ``math.<fn>(<number>)`` are formatted
    (the one computed gold in the suite); anything else raises ValueError."""
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(value.value)
                continue
            inner = value.value
            if not (
                isinstance(inner, ast.Call)
                and isinstance(inner.func, ast.Attribute)
                and isinstance(inner.func.value, ast.Name)
                and inner.func.value.id == "math"
                and inner.func.attr in ("sqrt", "log", "exp")
            ):
                raise ValueError("an f-string this reader does not format")
            number = getattr(math, inner.func.attr)(*(ast.literal_eval(a) for a in inner.args))
            spec = literal(value.format_spec) if value.format_spec is not None else ""
            parts.append(format(number, spec))
        return "".join(parts)
    if isinstance(node, ast.Tuple):
        return tuple(literal(e) for e in node.elts)
    return ast.literal_eval(node)


def _call_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        if isinstance(node.func, ast.Name):
            return node.func.id
        if isinstance(node.func, ast.Attribute):
            return node.func.attr
    return None


def _options(call: ast.Call, bound: dict) -> dict:
    """The keyword options of a compare_strings call, with parameter names resolved."""
    options = {}
    for kw in call.keywords:
        if isinstance(kw.value, ast.Name):
            options[kw.arg] = bound.get(kw.value.id)
        else:
            options[kw.arg] = literal(kw.value)
    return options


def cases_in(path: Path) -> list[dict]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    cases = []
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        calls = [n for n in ast.walk(fn) if _call_name(n) in ("compare_strings", "verify")]
        compare = next((c for c in calls if _call_name(c) == "compare_strings"), None)
        for deco in fn.decorator_list:
            if _call_name(deco) != "parametrize":
                continue
            names = [n.strip() for n in literal(deco.args[0]).split(",")]
            if "gold" not in names or "pred" not in names:
                continue
            label = next((n for n in LABEL_NAMES if n in names), None)
            for element in deco.args[1].elts:
                try:
                    values = literal(element)
                except ValueError:
                    continue
                bound = dict(zip(names, values, strict=True))
                options = _options(compare, bound) if compare is not None else {}
                cases.append(
                    {"test": f"{path.name}::{fn.name}", "gold": bound["gold"],
                     "pred": bound["pred"], "expected": bool(bound[label]), "options": options}
                )  # fmt: skip
        if fn.decorator_list:
            continue
        # plain asserts: compare_strings("gold", "pred", ...) == 0 or 1
        for node in ast.walk(fn):
            if not (
                isinstance(node, ast.Compare)
                and _call_name(node.left) == "compare_strings"
                and isinstance(node.ops[0], ast.Eq)
            ):
                continue
            try:
                gold, pred = (literal(a) for a in node.left.args[:2])
                expected = literal(node.comparators[0])
            except ValueError:
                continue
            cases.append(
                {"test": f"{path.name}::{fn.name}", "gold": gold, "pred": pred,
                 "expected": bool(expected), "options": _options(node.left, {})}
            )  # fmt: skip
    return cases


# --------------------------------------------------------------------------- grading


def grade_cases(cases: list[dict]) -> list[dict]:
    from pt_eval.extract import gold_answer
    from pt_eval.policy import Policy
    from pt_eval.worker import GradingPool

    by_policy: dict[Policy, list[int]] = {}
    for index, case in enumerate(cases):
        by_policy.setdefault(case_policy(case["options"]), []).append(index)
    results: list[dict | None] = [None] * len(cases)
    for policy, indices in by_policy.items():
        with GradingPool(workers=2, policy=policy) as pool:
            golds = [gold_answer(cases[i]["gold"]) for i in indices]
            items = [(cases[i]["pred"], gold) for i, gold in zip(indices, golds, strict=True)]
            for i, gold, result in zip(indices, golds, pool.grade(items), strict=True):
                results[i] = {**result, "gold_extracted": gold}
    return results  # type: ignore[return-value]


def case_policy(options: dict):
    """pt-eval's settings for a Math-Verify test's options (see the module docstring)."""
    from pt_eval.policy import Policy

    precision = options.get("precision")
    return Policy(
        numeric_tolerance=10.0**-precision if precision is not None else None,
        # Math-Verify's "expr" target is its plain-number extraction: without it, no
        # fallback to the last number of the text
        last_number=None if "expr" in options.get("match_types", ["latex", "expr"]) else False,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sdist", type=Path, help="a local math_verify-*.tar.gz")
    parser.add_argument("--version", help="Math-Verify version (default: the installed one)")
    parser.add_argument("--show", choices=("diff", "all", "none"), default="diff")
    parser.add_argument("--dump", type=Path, help="write the extracted cases to this jsonl")
    args = parser.parse_args()
    version = args.version or metadata.version("math-verify")
    with tempfile.TemporaryDirectory(prefix="mv-suite-") as tmp:
        sdist = args.sdist or download_sdist(version, Path(tmp))
        cases = [c for f in test_files(sdist, Path(tmp)) for c in cases_in(f)]
    if args.dump:
        with open(args.dump, "w", encoding="utf-8") as fh:
            for case in cases:
                fh.write(json.dumps(case, ensure_ascii=False) + "\n")
    results = grade_cases(cases)
    agree = 0
    for number, (case, result) in enumerate(zip(cases, results, strict=True)):
        same = bool(result["correct"]) == case["expected"]
        agree += same
        if args.show == "all" or (args.show == "diff" and not same):
            print(
                f"{'  ' if same else '!='} #{number} {case['test']} expected {int(case['expected'])} "
                f"pt-eval {int(bool(result['correct']))} ({result['status']}) "
                f"options {case['options']}\n     gold {case['gold'][-160:]!r}\n"
                f"     gold extracted {result['gold_extracted']!r}\n"
                f"     pred {case['pred'][-160:]!r}\n     pred extracted {result['extracted']!r}"
            )
    summary = {"math_verify": version, "cases": len(cases), "agree": agree,
               "agreement": round(agree / len(cases), 4) if cases else None}  # fmt: skip
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
