"""Generated datasets for offline runs: problems a tiny model can learn on a CPU.

``arithmetic``: additions and subtractions of two ``digits``-digit numbers (2 by
default; ``ops`` picks the operators), as MATH-like rows ``{id, problem, solution,
answer}``. The solution works column by column, the way the problem is done by hand,
and ends in ``\\boxed{answer}``:

    What is 87 + 45?
    Ones: 7+5=12, carry 1. Tens: 8+4+1=13. The final answer is \\boxed{132}.

Each step is a one-digit fact next to the digits it uses, which a small model
learns in minutes; asked for the whole sum in one token run, it would need far
longer. Train and test problems are disjoint. Feed them to ``pt-data build`` with
transform ``math`` (SFT conversations) or ``math_prompts`` (prompts with gold
answers for rollout and evaluation).

``multiplication`` and ``calculator``: products of two ``digits``-digit numbers (5 by
default), too long for a tiny model to work out in its head, answered two ways. The
same ``n``, ``n_test``, ``digits`` and ``seed`` give both kinds the same problems under
the same ids, so that a model trained on each can be compared on one test set:

- ``multiplication``: answered directly, MATH-like rows ``{id, problem, solution,
  answer}`` (``What is 12345 * 67890?`` -> ``The final answer is \\boxed{838102050}.``);
- ``calculator``: solved with a tool, rows ``{id, problem, answer, messages, tools}``
  whose conversation calls :func:`multiply` and reads its result::

    user       What is 12345 * 67890?
    assistant  (a call: multiply(a=12345, b=67890))
    tool       838102050
    assistant  The final answer is \\boxed{838102050}.

  ``tools`` holds :func:`multiply`'s JSON schema, which the chat template lists in the
  conversation's opening; build SFT data with transform ``messages`` (the calls and the
  answer train, the tool's turn does not), and play the problems in the tool
  environment (``environment: {name: tools, tools: [calc.py:multiply]}``) with a
  ``multiply`` of the same signature and docstring.

A problem is the unordered pair of factors: ``a * b`` and ``b * a`` are one problem, so
no test problem is in train either way round.
"""

from __future__ import annotations

import functools
import math
import random
from pathlib import Path

from pt_core.errors import InputError
from pt_core.files import atomic_path, write_rows

GENERATORS = ("arithmetic", "multiplication", "calculator")
PRODUCTS = ("multiplication", "calculator")  # the generators that read ``digits``
DEFAULT_DIGITS = 5


PLACES = ("Ones", "Tens", "Hundreds", "Thousands", "Ten-thousands", "Hundred-thousands")
OPERATORS = ("+", "-")


def arithmetic_space(digits: int, ops: str) -> int:
    """The number of distinct problems: ``a + b`` for every pair, ``a - b`` for ``a >= b``."""
    numbers = 9 * 10 ** (digits - 1)
    return ("+" in ops) * numbers**2 + ("-" in ops) * numbers * (numbers + 1) // 2


def arithmetic_problems(digits: int = 2, ops: str = "+-") -> list[tuple[int, str, int]]:
    """Every distinct problem of two ``digits``-digit numbers (1 or 2): (a, op, b),
    subtraction only when a >= b."""
    low, high = 10 ** (digits - 1), 10**digits - 1
    problems = []
    for a in range(low, high + 1):
        for b in range(low, high + 1):
            if "+" in ops:
                problems.append((a, "+", b))
            if "-" in ops and a >= b:
                problems.append((a, "-", b))
    return problems


def nth_problem(index: int, digits: int, ops: str) -> tuple[int, str, int]:
    """Problem ``index`` of the ``digits``-digit problems, listed without being built:
    the sums first (a, then b, ascending), then the differences (a >= b)."""
    low = 10 ** (digits - 1)
    numbers = 9 * low
    if "+" in ops:
        if index < numbers**2:
            return low + index // numbers, "+", low + index % numbers
        index -= numbers**2
    # the differences with first term low + i are i + 1 (b = low .. low + i)
    i = (math.isqrt(8 * index + 1) - 1) // 2  # the largest i with i (i + 1) / 2 <= index
    return low + i, "-", low + index - i * (i + 1) // 2


def draw_problems(
    count: int, digits: int, ops: str, rng: random.Random
) -> list[tuple[int, str, int]]:
    """``count`` distinct problems in the order drawn. Up to two digits they are drawn
    from the list of every problem (as pt-data always has: the same seed, the same rows);
    beyond, by index from a count too large to list."""
    if digits <= 2:
        return rng.sample(arithmetic_problems(digits, ops), count)
    indices = rng.sample(range(arithmetic_space(digits, ops)), count)
    return [nth_problem(i, digits, ops) for i in indices]


def column_solution(a: int, op: str, b: int, *, careless: bool = False) -> tuple[str, int]:
    """The worked, column-by-column solution of ``a op b`` and its value: each column's
    one-digit fact with the carry (or borrow) it takes and the one it passes on; the
    last column's result is written whole.

    ``careless``: the solution of someone who forgets to pass carries and borrows on.
    Each column is worked as if nothing came from the one before ("carry 0", "borrow
    0"; a column short of its subtrahend still takes its ten), and the value is the one
    those columns spell, which is wrong whenever a carry or borrow was due."""
    if op not in OPERATORS:
        raise ValueError(f"unknown operator {op!r}")
    columns = max(len(str(a)), len(str(b)))
    steps, moved, value = [], 0, 0  # moved: the carry or borrow passed to the next column
    for i in range(columns):
        x, y = a // 10**i % 10, b // 10**i % 10
        place, last = PLACES[i], i == columns - 1
        if op == "+":
            total = x + y + moved
            terms = f"{x}+{y}" if i == 0 else f"{x}+{y}+{moved}"
            passed = 0 if careless else total // 10
            steps.append(f"{place}: {terms}={total}" + ("." if last else f", carry {passed}."))
            digit = total if last else total % 10
        else:
            out = 0 if last else int(x - moved < y)
            top = x + 10 * out
            terms = f"{top}-{y}" if i == 0 else f"{top}-{y}-{moved}"
            passed = 0 if careless else out
            digit = top - y - moved
            steps.append(f"{place}: {terms}={digit}" + ("." if last else f", borrow {passed}."))
        value += digit * 10**i
        moved = passed
    return f"{' '.join(steps)} The final answer is \\boxed{{{value}}}.", value


def carries(a: int, op: str, b: int) -> bool:
    """Whether ``a op b`` passes a carry (or a borrow) from one column to the next: the
    careless solution then spells another value than the true one."""
    return column_solution(a, op, b, careless=True)[1] != column_solution(a, op, b)[1]


def arithmetic_row(a: int, op: str, b: int, row_id: str, *, flawed: bool = False) -> dict:
    """A problem, its worked solution and the true answer. ``flawed``: the solution is the
    careless one (:func:`column_solution`), marked ``"flawed": true``; ``answer`` stays
    the true value, which a grader checks against."""
    solution, value = column_solution(a, op, b)
    if flawed:
        solution, _ = column_solution(a, op, b, careless=True)
    row = {"id": row_id, "problem": f"What is {a} {op} {b}?", "solution": solution,
           "answer": str(value)}  # fmt: skip
    return row | {"flawed": True} if flawed else row


def default_n_test(n: int) -> int:
    """The test rows when none are asked for: a tenth of the train rows, within 50..500."""
    return min(500, max(50, n // 10))


def check_counts(n: int, n_test: int, space: int, what: str) -> None:
    if n < 1 or n_test < 0 or n + n_test > space:
        raise InputError(
            f"asked for {n} train + {n_test} test problems; there are {space} distinct "
            f"{what} problems",
            hint=f"use --n between 1 and {space - n_test}" if 0 <= n_test < space else (
                "use a --n-test below the number of problems"),
        )  # fmt: skip


def id_prefix(digits: int, ops: str) -> str:
    """What a row's id starts with: ``arith`` for the default 2-digit sums and differences,
    else the operators and the digits (``add3``, ``sub3``, ``arith4``), so that test sets of
    several kinds built into one prompt set keep distinct ids."""
    name = {"+": "add", "-": "sub"}.get(ops, "arith")
    return name if digits == 2 and ops == "+-" else f"{name}{digits}"


def synth_arithmetic(n: int, *, n_test: int | None = None, seed: int = 0, digits: int = 2,
                     ops: str = "+-", flawed: float = 0.0) -> dict[str, list[dict]]:  # fmt: skip
    """``n`` train rows and ``n_test`` (default ``min(500, max(50, n // 10))``) test rows
    of two ``digits``-digit numbers and the operators ``ops``, no problem in both.

    ``flawed``: the share of the train problems with a carry or borrow whose solution is
    the careless one, drawn by a generator of their own (seeded with ``seed``), so the
    problems and the other rows are those drawn without it. Test rows are never flawed."""
    if not 1 <= digits <= len(PLACES):
        raise InputError(f"--digits {digits}: arithmetic works columns 1 to {len(PLACES)}",
                         hint=f"use --digits between 1 and {len(PLACES)} (2 by default)")  # fmt: skip
    if not ops or set(ops) - set(OPERATORS) or len(set(ops)) != len(ops):
        raise InputError(f"--ops {ops!r}: arithmetic's operators are + and -",
                         hint="use --ops +, --ops - or --ops +- (the default)")  # fmt: skip
    if not 0.0 <= flawed <= 1.0:
        raise InputError(f"--flawed {flawed}: it is a share of the problems, from 0 to 1",
                         hint="use e.g. --flawed 0.4 (0, none flawed, by default)")  # fmt: skip
    if n_test is None:
        n_test = default_n_test(n)
    check_counts(n, n_test, arithmetic_space(digits, ops), f"{digits}-digit {ops} arithmetic")
    rng = random.Random(seed)
    chosen = draw_problems(n + n_test, digits, ops, rng)
    name = id_prefix(digits, ops)
    test = [arithmetic_row(*p, f"{name}-test-{i}") for i, p in enumerate(chosen[:n_test])]
    careless = random.Random(seed)  # its own draws: the problems do not depend on --flawed
    train = [
        arithmetic_row(
            *p, f"{name}-train-{i}",
            flawed=flawed > 0 and carries(*p) and careless.random() < flawed,
        )
        for i, p in enumerate(chosen[n_test:])
    ]  # fmt: skip
    return {"train": train, "test": test}


# ----------------------------------------------------------------------------- products


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


def multiply_schema() -> dict:
    """:func:`multiply`'s tool schema, as the tool environment offers a function of its
    signature and docstring (transformers' ``get_json_schema``)."""
    from transformers.utils.chat_template_utils import get_json_schema

    return get_json_schema(multiply)


def factor_pairs(count: int, digits: int, rng: random.Random) -> list[tuple[int, int]]:
    """``count`` distinct problems ``(a, b)`` of two ``digits``-digit factors, in the order
    drawn; ``(a, b)`` and ``(b, a)`` are one problem."""
    low, high = 10 ** (digits - 1), 10**digits - 1
    numbers = high - low + 1
    if numbers <= 1000:  # few enough to list every problem and sample without repeats
        space = [(a, b) for a in range(low, high + 1) for b in range(a, high + 1)]
        return [(a, b) if rng.random() < 0.5 else (b, a) for a, b in rng.sample(space, count)]
    seen: set[tuple[int, int]] = set()
    pairs = []
    while len(pairs) < count:  # 4 * 10**7 problems at least: a repeat is rare
        a, b = rng.randint(low, high), rng.randint(low, high)
        if (min(a, b), max(a, b)) not in seen:
            seen.add((min(a, b), max(a, b)))
            pairs.append((a, b))
    return pairs


def product_space(digits: int) -> int:
    """The number of distinct problems of two ``digits``-digit factors (unordered pairs)."""
    numbers = 9 * 10 ** (digits - 1)
    return numbers * (numbers + 1) // 2


def multiplication_row(a: int, b: int, row_id: str) -> dict:
    """The problem answered directly."""
    value = a * b
    return {
        "id": row_id,
        "problem": f"What is {a} * {b}?",
        "solution": f"The final answer is \\boxed{{{value}}}.",
        "answer": str(value),
    }


def calculator_row(a: int, b: int, row_id: str, tools: list[dict]) -> dict:
    """The problem solved by a call of :func:`multiply`: the call, the tool's answer (the
    message the tool environment appends), the final answer."""
    value = multiply(a, b)
    call = {"type": "function", "function": {"name": "multiply", "arguments": {"a": a, "b": b}}}
    messages = [
        {"role": "user", "content": f"What is {a} * {b}?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "multiply", "content": str(value)},
        {"role": "assistant", "content": f"The final answer is \\boxed{{{value}}}."},
    ]
    return {"id": row_id, "problem": messages[0]["content"], "answer": str(value),
            "messages": messages, "tools": tools}  # fmt: skip


def synth_products(kind: str, n: int, *, n_test: int | None = None, seed: int = 0,
                   digits: int = DEFAULT_DIGITS) -> dict[str, list[dict]]:  # fmt: skip
    """``n`` train and ``n_test`` test rows of ``kind`` (``multiplication`` or
    ``calculator``), no problem in both; the two kinds draw the same problems."""
    if digits < 1:
        raise InputError(f"--digits {digits}: a factor has at least one digit",
                         hint="use --digits 1 or more (5 by default)")  # fmt: skip
    if n_test is None:
        n_test = default_n_test(n)
    check_counts(n, n_test, product_space(digits), f"{digits}-digit multiplication")
    pairs = factor_pairs(n + n_test, digits, random.Random(seed))
    make = (
        functools.partial(calculator_row, tools=[multiply_schema()])
        if kind == "calculator"
        else multiplication_row
    )
    return {
        "train": [make(a, b, f"mul-train-{i}") for i, (a, b) in enumerate(pairs[n_test:])],
        "test": [make(a, b, f"mul-test-{i}") for i, (a, b) in enumerate(pairs[:n_test])],
    }


def synth_rows(kind: str, n: int, *, seed: int = 0, n_test: int | None = None,
               digits: int | None = None, ops: str | None = None,
               flawed: float | None = None) -> dict[str, list[dict]]:  # fmt: skip
    """The rows of generator ``kind``: ``{"train": rows, "test": rows}``."""
    if kind not in GENERATORS:
        raise InputError(f"unknown generator {kind!r}; known: {', '.join(GENERATORS)}")
    if kind in PRODUCTS:
        for flag, value in (("--ops", ops), ("--flawed", flawed)):
            if value is not None:
                raise InputError(f"{flag} is read by arithmetic; {kind} problems are products",
                                 hint=f"remove {flag}")  # fmt: skip
        digits = DEFAULT_DIGITS if digits is None else digits
        return synth_products(kind, n, n_test=n_test, seed=seed, digits=digits)
    return synth_arithmetic(n, n_test=n_test, seed=seed, digits=2 if digits is None else digits,
                            ops="+-" if ops is None else ops, flawed=flawed or 0.0)  # fmt: skip


def write_synth(kind: str, n: int, out: str | Path, *, seed: int = 0, n_test: int | None = None,
                digits: int | None = None, ops: str | None = None,
                flawed: float | None = None):  # fmt: skip
    """Write ``out/train.jsonl`` and ``out/test.jsonl``; return ``{split: rows}``."""
    splits = synth_rows(kind, n, seed=seed, n_test=n_test, digits=digits, ops=ops, flawed=flawed)
    with atomic_path(out) as tmp:
        tmp.mkdir()
        for split, rows in splits.items():
            write_rows(tmp / f"{split}.jsonl", rows)
    return {split: len(rows) for split, rows in splits.items()}
