"""Tools (pt_rollout.tools): a plain function's schema from its signature and docstring,
the functions pt refuses and why, and calls: answered with the result, or with an error
for the model (counted by kind), never a traceback of pt."""

from __future__ import annotations

import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pt_core.errors import ConfigError
from pt_rollout.tools import Toolbox, ToolCall
from pt_rollout.tools.toolbox import result_text

TOOLS_PY = '''
import os
import time
from typing import Literal


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first
        b: the second
    """
    print("a tool may print; its output goes to stderr")
    return a + b


def convert(value: float, unit: Literal["km", "mi"] = "km", tags: list[str] | None = None) -> dict:
    """Convert a distance.

    Longer words for the model.

    Args:
        value: the distance
        unit: the unit to convert to
        tags: labels to carry along
    """
    return {"value": value * (1.609 if unit == "km" else 1 / 1.609), "tags": tags}


def divide(a: int, b: int) -> float:
    """Divide a by b.

    Args:
        a: the dividend
        b: the divisor
    """
    return a / b


def sleep(seconds: float) -> str:
    """Sleep.

    Args:
        seconds: how long
    """
    time.sleep(seconds)
    return "slept"


def vanish() -> str:
    """End the process."""
    os._exit(3)


def meet(me: str, other: str, seconds: float) -> str:
    """Leave a mark, then wait for the other's.

    Args:
        me: this call's mark
        other: the mark to wait for
        seconds: how long to wait at most
    """
    folder = os.environ["MEET_DIR"]
    open(os.path.join(folder, me), "w").close()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if os.path.exists(os.path.join(folder, other)):
            return "met"
        time.sleep(0.01)
    return "alone"
'''


@pytest.fixture(scope="module")
def tools_py(tmp_path_factory):
    path = tmp_path_factory.mktemp("tools") / "tools.py"
    path.write_text(TOOLS_PY)
    return path


@pytest.fixture(scope="module")
def toolbox(tools_py):
    names = ["add", "convert", "divide", "sleep", "vanish"]
    with Toolbox([f"{tools_py}:{n}" for n in names], timeout_seconds=2) as box:
        yield box


# --- schemas --------------------------------------------------------------------------------


def test_a_schema_comes_from_the_signature_and_the_docstring(toolbox):
    """Type hints give the types (a Literal an enum, an Optional nullable, a default makes
    a parameter optional); the docstring's text before Args: is the description, and its
    Args: lines describe the parameters."""
    assert toolbox.schemas[1] == {
        "type": "function",
        "function": {
            "name": "convert",
            "description": "Convert a distance.\n\nLonger words for the model.",
            "parameters": {
                "type": "object",
                "properties": {
                    "value": {"type": "number", "description": "the distance"},
                    "unit": {"type": "string", "enum": ["km", "mi"],
                             "description": "the unit to convert to"},
                    "tags": {"type": "array", "items": {"type": "string"}, "nullable": True,
                             "description": "labels to carry along"},
                },
                "required": ["value"],
            },
            "return": {"type": "object"},
        },
    }  # fmt: skip
    assert toolbox.names == ["add", "convert", "divide", "sleep", "vanish"]


def test_a_module_function_and_a_file_function_name_the_same_tool(tools_py, monkeypatch):
    monkeypatch.syspath_prepend(str(tools_py.parent))
    with Toolbox(["tools:add"]) as by_module, Toolbox([f"{tools_py}:add"]) as by_path:
        assert by_module.schemas == by_path.schemas
        # the worker process imports the module from the caller's sys.path
        assert by_module.call(ToolCall("add", {"a": 2, "b": 3})).content == "5"


REFUSED = [
    ("def f(a, b: int):", "parameter 'a' has no type hint", "annotate it (a: int)"),
    (
        "def f(*numbers: int):",
        "takes *numbers, which the named arguments",
        "a parameter of its own",
    ),
    ("def f(a: int, **options: str):", "takes **options", "a parameter of its own"),
    ("def f(a: int, /, b: int):", "parameter 'a' is positional-only", "remove the /"),
    ("def f(a: object):", "a parameter's type has no JSON schema", "use str, int, float, bool"),
]


@pytest.mark.parametrize(("signature", "problem", "fix"), REFUSED)
def test_a_function_whose_signature_has_no_schema_is_refused_with_the_fix(
    tmp_path, signature, problem, fix
):
    doc = '    """Do it.\n\n    Args:\n        a: x\n        b: y\n        numbers: n\n        options: o\n    """'
    (tmp_path / "bad.py").write_text(f"{signature}\n{doc}\n    return 1\n")
    with pytest.raises(ConfigError) as caught:
        Toolbox([f"{tmp_path}/bad.py:f"])
    assert caught.value.message.startswith(f"tool {tmp_path}/bad.py:f: {problem}")
    assert fix in str(caught.value.hint)


@pytest.mark.parametrize(
    ("doc", "problem", "fix"),
    [
        ("", "has no docstring summary", "start its docstring with a line"),
        ('"""Add.\n\n    Args:\n        a: the first\n    """', "does not describe parameter 'b'",
         "add a line 'b: what it is' under 'Args:'"),
    ],
)  # fmt: skip
def test_a_function_without_a_description_is_refused(tmp_path, doc, problem, fix):
    """The model reads what a tool and each parameter are from the docstring."""
    (tmp_path / "bare.py").write_text(
        f"def add(a: int, b: int) -> int:\n    {doc}\n    return a + b\n"
    )
    with pytest.raises(ConfigError, match=problem) as caught:
        Toolbox([f"{tmp_path}/bare.py:add"])
    assert fix in str(caught.value.hint)


def test_two_tools_of_one_name_and_a_name_that_is_no_function_are_refused(tools_py):
    with pytest.raises(ConfigError, match="are both named 'add'"):
        Toolbox([f"{tools_py}:add", f"{tools_py}:add"])
    with pytest.raises(ConfigError, match=r"tools='.*tools.py:os' is not a function"):
        Toolbox([f"{tools_py}:os"])
    with pytest.raises(ConfigError, match="tool .*tools.py:Literal: is a .*, not a function"):
        Toolbox([f"{tools_py}:Literal"])


# --- calls ------------------------------------------------------------------------------------


def test_a_call_answers_with_the_result_as_text(toolbox):
    """A string as it is, anything else as JSON; what the tool printed is not in it."""
    added = toolbox.call(ToolCall("add", {"a": 2, "b": 40}))
    assert (added.content, added.error) == ("42", None)
    assert added.message() == {"role": "tool", "name": "add", "content": "42"}
    converted = toolbox.call(ToolCall("convert", {"value": 10, "unit": "mi", "tags": ["x"]}))
    assert converted.content == '{"value": 6.215040397762586, "tags": ["x"]}'


@pytest.mark.parametrize(
    ("call", "content"),
    [
        (ToolCall("add", {"a": 1}), "Error: add arguments: 'b' is missing."),
        (ToolCall("add", {"a": "1", "b": 2}), "Error: add arguments: 'a' must be an integer, not \"1\"."),
        (ToolCall("add", {"a": 1, "b": 2, "c": 3}),
         "Error: add arguments: 'c' is not a parameter (it takes a, b)."),
        (ToolCall("add", {"a": True, "b": 2.5}),
         "Error: add arguments: 'a' must be an integer, not true; 'b' must be an integer, not 2.5."),
        (ToolCall("convert", {"value": 1, "unit": "ft"}),
         'Error: convert arguments: \'unit\' must be one of ["km", "mi"], not "ft".'),
        (ToolCall("convert", {"value": 1, "tags": ["a", 2]}),
         "Error: convert arguments: 'tags' item 1 must be a string, not 2."),
    ],
)  # fmt: skip
def test_arguments_that_do_not_fit_the_schema_are_answered_with_what_is_wrong(
    toolbox, call, content
):
    """Checked before the tool runs: JSON's true is no integer, 2.5 no integer, a missing
    or unknown argument is named."""
    result = toolbox.call(call)
    assert (result.content, result.error) == (content, "bad_arguments")


def test_an_optional_argument_may_be_null_and_may_be_left_out(toolbox):
    assert toolbox.call(ToolCall("convert", {"value": 0, "tags": None})).error is None
    assert toolbox.call(ToolCall("convert", {"value": 0})).error is None


def test_an_unknown_tool_is_answered_with_the_tools_there_are(toolbox):
    result = toolbox.call(ToolCall("multiply", {"a": 1}))
    assert result.error == "unknown_tool"
    assert result.content == (
        "Error: there is no tool 'multiply'; the tools are add, convert, divide, sleep, vanish."
    )


def test_an_exception_in_the_tool_is_answered_with_its_type_and_message(toolbox):
    result = toolbox.call(ToolCall("divide", {"a": 1, "b": 0}))
    assert (result.content, result.error) == (
        "Error: divide raised ZeroDivisionError: division by zero", "raised",
    )  # fmt: skip


def test_a_call_past_its_time_limit_is_stopped_and_the_next_call_works(toolbox):
    started = time.monotonic()
    result = toolbox.call(ToolCall("sleep", {"seconds": 60}))
    assert (result.content, result.error) == (
        "Error: sleep did not finish within 2 s and was stopped.", "timeout",
    )  # fmt: skip
    assert time.monotonic() - started < 30  # not the 60 s it asked for
    assert toolbox.call(ToolCall("add", {"a": 1, "b": 1})).content == "2"  # a new worker


def test_a_tool_that_ends_its_process_is_answered_and_the_next_call_works(toolbox):
    result = toolbox.call(ToolCall("vanish", {}))
    assert (result.content, result.error) == (
        "Error: vanish ended its process (exit status 3).",
        "crashed",
    )
    assert toolbox.call(ToolCall("add", {"a": 1, "b": 1})).content == "2"


def test_calls_run_side_by_side_on_several_workers(tools_py, tmp_path, monkeypatch):
    """Two calls that each wait for the other meet only if they run at once: on two
    workers they do; one worker runs them one after the other, and the first waits alone."""
    monkeypatch.setenv("MEET_DIR", str(tmp_path))

    def calls(seconds: float) -> list[ToolCall]:
        return [ToolCall("meet", {"me": me, "other": other, "seconds": seconds})
                for me, other in (("x", "y"), ("y", "x"))]  # fmt: skip

    with Toolbox([f"{tools_py}:meet"], workers=2, timeout_seconds=60) as two:
        assert [r.content for r in two.call_many(calls(30))] == ["met", "met"]
    for mark in ("x", "y"):
        os.remove(tmp_path / mark)
    with Toolbox([f"{tools_py}:meet"], workers=1) as one:
        assert [r.content for r in one.call_many(calls(0.5))] == ["alone", "met"]


def test_a_long_result_is_cut_and_says_so():
    assert result_text("x" * 10, max_chars=4) == "xxxx\n[cut: 6 more characters]"
    assert result_text(None, max_chars=10) == "null"
    assert result_text({1, 2}, max_chars=10) == "{1, 2}"  # not JSON: str()


def test_bad_toolbox_settings_are_refused():
    with pytest.raises(ConfigError, match="each must be above 0"):
        Toolbox([], timeout_seconds=0)


# --- the built-in python tool ------------------------------------------------------------------


@pytest.fixture(scope="module")
def sandbox_here():
    from pt_rollout.sandbox import SandboxUnavailable, choose_backend

    try:
        return choose_backend()
    except SandboxUnavailable as exc:
        if os.environ.get("PT_REQUIRE_SANDBOX") == "1" or os.environ.get("CI") == "true":
            pytest.fail(str(exc))
        pytest.skip(str(exc))


def test_the_python_tool_runs_code_in_the_sandbox(sandbox_here):
    with Toolbox(["python"]) as box:
        schema = box.schemas[0]["function"]
        assert (schema["name"], schema["parameters"]["required"]) == ("python", ["code"])
        assert box.call(ToolCall("python", {"code": "print(6 * 7)"})).content == "42"
        failed = box.call(ToolCall("python", {"code": "import os\nprint(os.getuid())\n1 / 0"}))
    assert failed.error is None  # the tool worked: the program failed, and the model reads why
    assert failed.content.splitlines()[0] != "0"  # not root
    assert failed.content.endswith("ZeroDivisionError: division by zero\n[exit status 1]")


def test_a_python_call_stopped_by_the_toolbox_leaves_no_process(sandbox_here, tmp_path):
    """The toolbox's limit (1 s) comes before the sandbox's (20 s): the worker is killed,
    and with it the sandbox and the program (which marks its environment to be found)."""
    mark = f"{os.getpid()}-{time.monotonic_ns()}"
    code = textwrap.dedent(f"""
        import os, sys
        os.execve(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)"],
                  {{"PT_TOOL_MARK": "{mark}"}})
    """)
    with Toolbox(["python"], timeout_seconds=1) as box:
        assert box.call(ToolCall("python", {"code": code})).error == "timeout"
    deadline = time.monotonic() + 5
    while (left := _with_environ(f"PT_TOOL_MARK={mark}".encode())) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left == []


def _with_environ(mark: bytes) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if mark in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def test_a_toolbox_does_not_import_what_it_does_not_need():
    """The worker imports the tools' functions only: not transformers (whose import, for
    the schemas, takes seconds), so a new worker starts quickly."""
    code = "import sys; import pt_rollout.tools.worker; print('transformers' in sys.modules)"
    import subprocess

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout == "False\n", done.stderr


def test_the_docs_example_runs(qwen_tokenizer, tmp_path, monkeypatch):
    """docs/pt-rollout.md's Tools section: its first Python block is calc.py, its second
    runs beside it (with the real-shape Qwen tokenizer as ``tokenizer``)."""
    docs = (Path(__file__).resolve().parents[3] / "docs" / "pt-rollout.md").read_text()
    section = docs.partition("\n## Tools (")[2].partition("\n## ")[0]
    blocks = [b.partition("\n")[2] for b in section.split("```python")[1:]]
    blocks = [b.partition("```")[0] for b in blocks]
    assert len(blocks) == 2 and blocks[0].startswith("# calc.py\n")
    (tmp_path / "calc.py").write_text(blocks[0])
    monkeypatch.chdir(tmp_path)
    exec(compile(blocks[1], "docs/pt-rollout.md", "exec"), {"tokenizer": qwen_tokenizer})
