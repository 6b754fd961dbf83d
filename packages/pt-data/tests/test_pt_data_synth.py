"""`pt-data synth`: the generated problems, row by row, and their splits.

The product kinds (multiplication, calculator) are one set of problems answered two
ways: directly, and by a call of a multiply tool whose result the final answer repeats."""

from __future__ import annotations

import json

import pytest

from pt_core.errors import InputError
from pt_core.files import read_rows, split_path
from pt_data.synth import (
    arithmetic_problems,
    arithmetic_space,
    calculator_row,
    column_solution,
    multiplication_row,
    multiply_schema,
    nth_problem,
    synth_rows,
    write_synth,
)

# multiply's schema, written out: what the chat template shows the model in the opening
MULTIPLY_SCHEMA = {
    "type": "function",
    "function": {
        "name": "multiply",
        "description": "Multiply two integers.",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "integer", "description": "the first factor"},
                "b": {"type": "integer", "description": "the second factor"},
            },
            "required": ["a", "b"],
        },
        "return": {"type": "integer"},
    },
}


def test_a_multiplication_row_answers_directly():
    # 12345 * 67890 = 12345 * 60000 + 12345 * 7890 = 740,700,000 + 97,402,050
    assert multiplication_row(12345, 67890, "mul-test-0") == {
        "id": "mul-test-0",
        "problem": "What is 12345 * 67890?",
        "solution": "The final answer is \\boxed{838102050}.",
        "answer": "838102050",
    }


def test_a_calculator_row_calls_multiply_and_repeats_its_result():
    """The call names the tool and both factors as integers; the tool's message is the
    one the tool environment appends for it (name, the result as text); the final answer
    is the result, boxed."""
    row = calculator_row(12345, 67890, "mul-train-3", [MULTIPLY_SCHEMA])
    call = {"type": "function",
            "function": {"name": "multiply", "arguments": {"a": 12345, "b": 67890}}}  # fmt: skip
    assert row == {
        "id": "mul-train-3",
        "problem": "What is 12345 * 67890?",
        "answer": "838102050",
        "messages": [
            {"role": "user", "content": "What is 12345 * 67890?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "name": "multiply", "content": "838102050"},
            {"role": "assistant", "content": "The final answer is \\boxed{838102050}."},
        ],
        "tools": [MULTIPLY_SCHEMA],
    }
    assert multiply_schema() == MULTIPLY_SCHEMA


def factors(row: dict) -> tuple[int, int]:
    a, b = row["problem"].removeprefix("What is ").removesuffix("?").split(" * ")
    return int(a), int(b)


def test_the_two_product_kinds_draw_the_same_problems_under_the_same_ids():
    direct = synth_rows("multiplication", 40, n_test=10, seed=3)
    tool = synth_rows("calculator", 40, n_test=10, seed=3)
    for split, count in (("train", 40), ("test", 10)):
        assert len(direct[split]) == len(tool[split]) == count
        for d, t in zip(direct[split], tool[split], strict=True):
            assert (d["id"], d["problem"], d["answer"]) == (t["id"], t["problem"], t["answer"])
            a, b = factors(d)
            assert 10_000 <= a <= 99_999 and 10_000 <= b <= 99_999  # 5 digits by default
            assert d["answer"] == str(a * b)
            assert t["messages"][1]["tool_calls"][0]["function"]["arguments"] == {"a": a, "b": b}
    assert direct["test"][0]["id"] == "mul-test-0" and direct["train"][0]["id"] == "mul-train-0"


def test_no_test_problem_is_in_train_either_way_round():
    """With 2-digit factors (4,095 problems) 2,000 rows would draw repeats if any were
    allowed; a * b and b * a count as one problem."""
    rows = synth_rows("multiplication", 1900, n_test=100, seed=0, digits=2)
    train = [tuple(sorted(factors(r))) for r in rows["train"]]
    test = [tuple(sorted(factors(r))) for r in rows["test"]]
    assert len(set(train)) == 1900 and len(set(test)) == 100
    assert not set(train) & set(test)
    assert all(10 <= a <= 99 and 10 <= b <= 99 for a, b in train + test)


def test_the_seed_decides_the_problems():
    first = synth_rows("multiplication", 20, n_test=5, seed=1)
    assert synth_rows("multiplication", 20, n_test=5, seed=1) == first
    assert synth_rows("multiplication", 20, n_test=5, seed=2) != first


def test_every_problem_of_a_small_space_can_be_drawn():
    """One-digit factors make 45 problems; asking for all 45 gives each once."""
    rows = synth_rows("multiplication", 40, n_test=5, seed=0, digits=1)
    drawn = {tuple(sorted(factors(r))) for r in rows["train"] + rows["test"]}
    assert drawn == {(a, b) for a in range(1, 10) for b in range(a, 10)}


@pytest.mark.parametrize(
    ("kind", "n", "options", "says"),
    [
        ("algebra", 5, {}, "unknown generator 'algebra'; known: arithmetic, multiplication, calculator"),
        ("multiplication", 40, {"n_test": 10, "digits": 1},
         "asked for 40 train + 10 test problems; there are 45 distinct 1-digit multiplication"),
        ("calculator", 5, {"digits": 0}, "--digits 0: a factor has at least one digit"),
        ("arithmetic", 5, {"digits": 7}, "--digits 7: arithmetic works columns 1 to 6"),
        ("arithmetic", 5, {"digits": 0}, "--digits 0: arithmetic works columns 1 to 6"),
        ("arithmetic", 5, {"ops": "*"}, "--ops '*': arithmetic's operators are + and -"),
        ("arithmetic", 5, {"ops": "++"}, "--ops '++': arithmetic's operators are + and -"),
        ("arithmetic", 5, {"ops": ""}, "--ops '': arithmetic's operators are + and -"),
        ("arithmetic", 40, {"digits": 1, "ops": "-", "n_test": 10},
         "asked for 40 train + 10 test problems; there are 45 distinct 1-digit - arithmetic"),
        ("multiplication", 5, {"ops": "+"}, "--ops is read by arithmetic"),
        ("multiplication", 0, {}, "asked for 0 train"),
        ("arithmetic", 5, {"flawed": 1.5}, "--flawed 1.5: it is a share of the problems, from 0 to 1"),
        ("arithmetic", 5, {"flawed": -0.1}, "--flawed -0.1: it is a share of the problems"),
        ("calculator", 5, {"flawed": 0.4}, "--flawed is read by arithmetic"),
    ],
    ids=["unknown-kind", "too-many", "no-digits", "arithmetic-digits-7", "arithmetic-digits-0",
         "ops-times", "ops-twice", "ops-empty", "too-many-differences", "ops-of-products",
         "no-rows", "flawed-above-1", "flawed-below-0", "flawed-of-products"],
)  # fmt: skip
def test_bad_requests_are_one_clear_error(kind, n, options, says):
    with pytest.raises(InputError) as raised:
        synth_rows(kind, n, **options)
    assert says in str(raised.value)


def test_calculator_traces_build_into_rows_that_train_the_call_and_the_answer(
    tmp_path, tiny_tokenizer, tiny_tokenizer_dir
):
    """Built with transform messages and the tokenizer pt-data makes (ChatML that renders
    tools and calls as Qwen2.5's does): the tools are listed in the opening, and the ids
    trained are the call, in <tool_call> tags, and the final answer; the tool's answer,
    a user turn of the template, is context."""
    from pt_data.build import build
    from pt_data.config import DataConfig

    write_synth("calculator", 3, tmp_path / "synth", n_test=1, seed=0)
    cfg = DataConfig.model_validate({
        "datasets": [{"source": str(tmp_path / "synth" / "train.jsonl"), "transform": "messages"}],
        "tokenizer": {"name_or_path": str(tiny_tokenizer_dir), "packing": False},
    })  # fmt: skip
    build(cfg, out_dir=tmp_path / "out")
    trace = read_rows(tmp_path / "synth" / "train.jsonl")[0]
    a, b = factors(trace)
    row = read_rows(split_path(tmp_path / "out", "train"))[0]
    trained = [t for t, label in zip(row["input_ids"], row["labels"], strict=True) if label != -100]
    assert tiny_tokenizer.decode(trained) == (
        f'<tool_call>\n{{"name": "multiply", "arguments": {{"a": {a}, "b": {b}}}}}\n</tool_call>'
        f"<|im_end|>The final answer is \\boxed{{{a * b}}}.<|im_end|>"
    )
    text = tiny_tokenizer.decode(row["input_ids"])
    assert "<tools>\n" + json.dumps(MULTIPLY_SCHEMA) + "\n</tools>" in text
    assert f"<tool_response>\n{a * b}\n</tool_response>" in text


# ----------------------------------------------------------------------------- arithmetic


@pytest.mark.parametrize(
    ("a", "op", "b", "solution"),
    [
        (87, "+", 45, "Ones: 7+5=12, carry 1. Tens: 8+4+1=13."),
        (22, "-", 20, "Ones: 2-0=2, borrow 0. Tens: 2-2-0=0."),
        (703, "+", 387, "Ones: 3+7=10, carry 1. Tens: 0+8+1=9, carry 0. Hundreds: 7+3+0=10."),
        # a borrow passed on twice, and a column that borrows because of the one it took
        (823, "-", 594, "Ones: 13-4=9, borrow 1. Tens: 12-9-1=2, borrow 1. Hundreds: 8-5-1=2."),
        (305, "-", 210, "Ones: 5-0=5, borrow 0. Tens: 10-1-0=9, borrow 1. Hundreds: 3-2-1=0."),
        (9999, "+", 1, "Ones: 9+1=10, carry 1. Tens: 9+0+1=10, carry 1. "
                       "Hundreds: 9+0+1=10, carry 1. Thousands: 9+0+1=10."),
        (8, "-", 3, "Ones: 8-3=5."),
    ],
)  # fmt: skip
def test_a_column_solution_is_the_sum_worked_by_hand(a, op, b, solution):
    value = a + b if op == "+" else a - b
    assert column_solution(a, op, b) == (
        f"{solution} The final answer is \\boxed{{{value}}}.",
        value,
    )


def terms(row: dict) -> tuple[int, str, int]:
    a, op, b = row["problem"].removeprefix("What is ").removesuffix("?").split()
    return int(a), op, int(b)


@pytest.mark.parametrize(
    ("a", "op", "b", "solution", "value"),
    [
        (48, "+", 72, "Ones: 8+2=10, carry 0. Tens: 4+7+0=11.", 110),
        (87, "+", 45, "Ones: 7+5=12, carry 0. Tens: 8+4+0=12.", 122),
        (91, "-", 37, "Ones: 11-7=4, borrow 0. Tens: 9-3-0=6.", 64),
        # each column that is short takes its ten, and none is paid back
        (823, "-", 594, "Ones: 13-4=9, borrow 0. Tens: 12-9-0=3, borrow 0. Hundreds: 8-5-0=3.",
         339),
        (9999, "+", 1, "Ones: 9+1=10, carry 0. Tens: 9+0+0=9, carry 0. "
                       "Hundreds: 9+0+0=9, carry 0. Thousands: 9+0+0=9.", 9990),
        (42, "+", 31, "Ones: 2+1=3, carry 0. Tens: 4+3+0=7.", 73),  # nothing to forget
    ],
)  # fmt: skip
def test_a_careless_solution_forgets_every_carry_and_borrow(a, op, b, solution, value):
    assert column_solution(a, op, b, careless=True) == (
        f"{solution} The final answer is \\boxed{{{value}}}.",
        value,
    )


def test_flawed_rows_are_the_share_asked_of_the_problems_with_a_carry_and_only_those():
    """--flawed 0.4: the problems, ids and test rows are those drawn without it; a train
    problem with a carry or borrow has the careless solution 40% of the time, marked, its
    answer still the true value; a problem without one never has."""
    clean = synth_rows("arithmetic", 8000, n_test=200, seed=0)
    rows = synth_rows("arithmetic", 8000, n_test=200, seed=0, flawed=0.4)
    assert rows["test"] == clean["test"]
    assert [r["id"] for r in rows["train"]] == [r["id"] for r in clean["train"]]
    assert [r["answer"] for r in rows["train"]] == [r["answer"] for r in clean["train"]]
    with_carry = flawed = 0
    for row, same in zip(rows["train"], clean["train"], strict=True):
        a, op, b = terms(row)
        due = (a % 10 + b % 10 >= 10) if op == "+" else (a % 10 < b % 10)  # 2 digits: ones
        with_carry += due
        if row.get("flawed"):
            flawed += 1
            assert due and row["solution"] == column_solution(a, op, b, careless=True)[0]
            assert row["solution"] != same["solution"]
            assert row.keys() - same.keys() == {"flawed"}
        else:
            assert row == same
    assert with_carry == 3449 and flawed == 1333  # 38.6% of them
    assert synth_rows("arithmetic", 8000, n_test=200, seed=0, flawed=0.0) == clean
    # all of them: every 3-digit problem whose careless solution differs, and only those
    everything = synth_rows("arithmetic", 500, n_test=50, seed=3, digits=3, flawed=1.0)
    for row in everything["train"]:
        careless = column_solution(*terms(row), careless=True)[0]
        assert row.get("flawed", False) == (careless != column_solution(*terms(row))[0])
        assert row["solution"] == careless


def test_the_default_arithmetic_rows_are_those_pt_data_always_drew():
    """2-digit sums and differences, seed 0: the rows (ids, problems, order) the
    quickstart has trained on since the generator began."""
    rows = synth_rows("arithmetic", 8000, n_test=200, seed=0)
    assert rows["train"][0] == {
        "id": "arith-train-0", "problem": "What is 98 + 97?",
        "solution": "Ones: 8+7=15, carry 1. Tens: 9+9+1=19. The final answer is \\boxed{195}.",
        "answer": "195",
    }  # fmt: skip
    assert rows["train"][1]["problem"] == "What is 76 + 60?"
    assert rows["test"][194]["problem"] == "What is 22 - 20?"


@pytest.mark.parametrize("ops", ["+-", "+", "-"])
def test_the_problems_listed_by_index_are_every_problem_once(ops):
    """nth_problem, which draws 3 digits and more without listing them, walks the 2-digit
    problems as well: every index gives a problem, and together they are the list."""
    drawn = [nth_problem(i, 2, ops) for i in range(arithmetic_space(2, ops))]
    assert len(set(drawn)) == len(drawn)
    assert set(drawn) == set(arithmetic_problems(2, ops))


@pytest.mark.parametrize(("digits", "ops", "prefix"), [(3, "+", "add3"), (4, "+-", "arith4"),
                                                      (3, "-", "sub3"), (1, "+-", "arith1")])  # fmt: skip
def test_longer_numbers_make_distinct_problems_answered_by_their_own_solution(digits, ops, prefix):
    rows = synth_rows("arithmetic", 80, n_test=40, seed=5, digits=digits, ops=ops)
    both = rows["train"] + rows["test"]
    problems = [r["problem"] for r in both]
    assert len(set(problems)) == len(problems)  # train and test are disjoint
    assert [r["id"] for r in rows["test"][:2]] == [f"{prefix}-test-0", f"{prefix}-test-1"]
    for row in both:
        a, op, b = row["problem"].removeprefix("What is ").removesuffix("?").split()
        assert op in ops and len(a) == len(b) == digits
        assert int(row["answer"]) == (int(a) + int(b) if op == "+" else int(a) - int(b)) >= 0
        assert row["solution"].endswith(f"\\boxed{{{row['answer']}}}.")
        assert row["solution"].count(": ") == digits  # one step per column
