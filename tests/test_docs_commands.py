"""Every command shown in the docs is run by a test.

The command lines of README.md's and docs/*.md's fenced blocks (``bash``, ``sh``, or no
language) that start with a tool (pt, pt-data, pt-train, pt-rollout, pt-eval, pt-slurm,
``uv run``, ``bash``) are each in exactly one class here:

- RUN: run here, in a directory of the documented file names made from the session's
  quickstart outputs (tests/conftest.py); where the line as written would need hours of
  CPU or a hub model, the variant run here says what it changes and why, and the line
  as written is parsed too;
- SYNOPSIS: a usage line (``[--out DIR]``, ``CONFIG``, ``...``); every option it names
  is an option of its subcommand;
- ELSEWHERE: run by another test, named ``path::test`` (that test exists), or by CI;
- PARSE_ONLY: needs what a test machine lacks; its arguments are parsed by the CLI,
  with the reason it is not run.

A command added to the docs in no class fails the classification test, naming the file
and line; a class entry no doc shows any more fails it too.
"""

from __future__ import annotations

import importlib
import json
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer
import yaml
from shell import sh

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "examples" / "quickstart"
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHARED_PREDICTIONS = REPO.parent / "shared" / "predictions" / "math_cot_100.jsonl"

TOOLS = {
    "pt": "pt_core.umbrella",
    "pt-data": "pt_data.cli",
    "pt-train": "pt_train.cli",
    "pt-rollout": "pt_rollout.cli",
    "pt-eval": "pt_eval.cli",
    "pt-slurm": "pt_slurm.cli",
}
FENCE = re.compile(r"^\s*```(\S*)")
COMMAND_BLOCKS = ("bash", "sh", "")


@dataclass(frozen=True)
class DocCommand:
    page: str  # relative to the repository
    line: int  # 1-based, the command's first line
    text: str  # continuation lines joined, trailing comment dropped

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.text}"


def is_command(line: str) -> bool:
    words = line.split()
    return bool(words) and (words[0] in TOOLS or words[0] == "bash" or words[:2] == ["uv", "run"])


def doc_commands() -> list[DocCommand]:
    """The command lines of every page's fenced bash, sh and unlabelled blocks."""
    found = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        language = None  # None: outside a block
        i = 0
        while i < len(lines):
            fence = FENCE.match(lines[i])
            if fence:
                language = fence.group(1) if language is None else None
            elif language in COMMAND_BLOCKS and is_command(lines[i].strip()):
                start, text = i, lines[i].strip()
                while text.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    text = f"{text[:-1].rstrip()} {lines[i].strip()}"
                text = re.sub(r"\s+#\s.*$", "", text).strip()
                found.append(DocCommand(str(page.relative_to(REPO)), start + 1, text))
            i += 1
    return found


# --- the classes -------------------------------------------------------------------------

# RUN, in the order they run (later ones read what earlier ones wrote): the command as the
# docs show it, and the variant run here (None: the same) with why it differs.
PIPE_INTO_TRAINING = "pt-data build data.yaml | pt-train run train.yaml --data -"
SHORT = "1024 new tokens for each of many samples is minutes on two CPU cores; 16 here"
RUN: list[tuple[str, str | None, str]] = [
    ("pt-data synth arithmetic --n 2000 --out data/arith", None, ""),
    ("pt-data tokenizer --texts rows.jsonl --out tok", None, ""),
    ("pt-data templates", None, ""),
    ("pt-data build data.yaml", None, ""),
    ("pt-data check data.yaml", None, ""),
    ("pt-data inspect data.yaml --stage tokenized -n 3", None, ""),
    ("pt-data stats data.yaml --plot lengths.png", None, ""),
    (PIPE_INTO_TRAINING, None, ""),
    ("pt-train run train.yaml --data out/data/sft-mix", None, ""),
    (
        "pt-train run train.yaml training.learning_rate=5e-6 objective.name=dft run_name=dft",
        None,
        "",
    ),
    (
        "pt-train run train.yaml | pt-rollout generate --model - --prompts prompts.jsonl",
        "pt-train run train.yaml | pt-rollout generate --model - --prompts prompts.jsonl"
        " --max-tokens 16",
        SHORT,
    ),
    (
        "pt-train run train.yaml | pt-eval run --model - --benchmark math500",
        "pt-train run train.yaml | pt-eval run --model - --benchmark math500 --max-tokens 16",
        SHORT,
    ),
    (
        "pt-train run train.yaml | pt-eval run --model - --benchmark gsm8k --limit 200",
        "pt-train run train.yaml | pt-eval run --model - --benchmark gsm8k --limit 200"
        " --max-tokens 16",
        SHORT,
    ),
    # after the runs on out/data/sft-mix: these rewrite it (a resume on it is then refused)
    ("pt-data build data.yaml data.seed=3 data.datasets.0.weight=2", None, ""),
    ("pt-data build data.yaml data.datasets.0.weight=2", None, ""),
    ("pt-train plot runs/sft-tiny", None, ""),
    ("pt-train push runs/sft-tiny", None, ""),
    ("pt-train plot runs/grpo --key sampled_reward --smooth 10", None, ""),
    ("pt-slurm submit train.yaml --dry-run", None, ""),
    ("pt-eval grade predictions.jsonl", None, ""),
    ("pt-eval grade predictions.jsonl --group-key level", None, ""),
    ("pt-data pairs grades.jsonl", None, ""),
    (
        "pt-rollout generate --model out/sft/inference/step-500 --prompts data/prompts --n 8"
        " --temperature 1.0 --max-tokens 1024 --out rollouts.jsonl",
        "pt-rollout generate --model out/sft/inference/step-500 --prompts data/prompts --n 8"
        " --temperature 1.0 --max-tokens 16 --out rollouts.jsonl",
        SHORT,
    ),
    (
        "pt-rollout score --teacher Qwen/Qwen2.5-7B-Instruct --rollouts rollouts.jsonl --top-k 8"
        " --out scores.jsonl",
        "pt-rollout score --teacher teacher --rollouts rollouts.jsonl --top-k 8 --out scores.jsonl",
        "a 7B hub model; the teacher here is the quickstart's DFT model (the same tokenizer)",
    ),
    (
        "pt-rollout generate --model ckpt --prompts prompts.jsonl"
        " | pt-rollout score --teacher big --rollouts -",
        "pt-rollout generate --model ckpt --prompts prompts.jsonl --max-tokens 16"
        " | pt-rollout score --teacher big --rollouts -",
        SHORT,
    ),
    (
        "pt-rollout generate --model ckpt --prompts gsm8k.jsonl | pt-eval grade -",
        "pt-rollout generate --model ckpt --prompts gsm8k.jsonl --max-tokens 16 | pt-eval grade -",
        SHORT,
    ),
    (
        "pt-rollout generate --model ckpt --prompts prompts.jsonl | pt-eval grade -",
        "pt-rollout generate --model ckpt --prompts prompts.jsonl --max-tokens 16"
        " | pt-eval grade -",
        SHORT,
    ),
    (
        "pt-eval run --model out/sft/inference/step-500 --benchmark math500 --n 16",
        "pt-eval run --model out/sft/inference/step-500 --benchmark math500 --n 16 --max-tokens 16",
        SHORT,
    ),
    (
        "pt-eval run --model ckpt --benchmark math500 --n 16",
        "pt-eval run --model ckpt --benchmark math500 --n 16 --max-tokens 16",
        SHORT,
    ),
    (
        "pt-eval run --model Qwen/Qwen2.5-Math-1.5B --benchmark my_set.jsonl --prompt-key text",
        "pt-eval run --model ckpt --benchmark my_set.jsonl --prompt-key text --max-tokens 16",
        "a hub model; the quickstart's SFT model here, and " + SHORT,
    ),
]

# The pipe and the path (docs/contracts.md) are two ways to start one run; each starts its
# own here (a run resumed with its data named another way is refused: data.path changed).
FRESH_START = {"pt-train run train.yaml --data out/data/sft-mix": "runs/sft"}

SYNOPSIS = {
    "pt-data build CONFIG [key=value ...] [--out DIR] [--skip-bad] [--shard I/N]",
    "pt-data inspect CONFIG [key=value ...] [--stage STAGE] [-n N] [--dataset I] [--json]"
    " [--skip-bad]",
    "pt-data inspect DATASET|- [-n N] [--split S] [--tokenizer DIR] [--json] [--skip-bad]",
    "pt-data stats CONFIG [key=value ...] [--limit N] [--plot lengths.png] [--skip-bad]",
    "pt-data stats DATASET|- [--split S] [--plot lengths.png] [--skip-bad]",
    "pt-data pairs GRADES|- [--out DIR] [--strategy one|all|margin] [--k K] [--seed S]",
    "pt-data synth arithmetic --n N --out DIR [--digits D] [--ops +|-|+-] [--flawed SHARE]"
    " [--seed S] [--n-test M]",
    "pt-data synth multiplication --n N --out DIR [--digits D] [--seed S] [--n-test M]",
    "pt-data synth calculator --n N --out DIR [--digits D] [--seed S] [--n-test M]",
    "pt-data tokenizer --texts ROWS.jsonl [--texts MORE.parquet ...] --out DIR"
    " [--vocab-size 512] [--skip-bad]",
    "pt-rollout generate ... | pt-eval grade - | pt-data pairs - | pt-train run dpo.yaml --data -",
    "pt-rollout generate ... | pt-rollout score --teacher T --rollouts - --top-k 8"
    " | pt-train run opd.yaml --data -",
    "pt-train run train.yaml [key.path=value ...] [--data PATH|-] [--force-resume]",
    "pt-train init train.yaml [--out DIR]",
    "pt-train check train.yaml [key.path=value ...] [--world-size N | --nodes N]",
    "pt-data check CONFIG [key=value ...]",
    "pt-train push runs/sft-tiny [--repo-id NAMESPACE/NAME]",
}

COMING_FROM = "tests/test_coming_from.py::test_the_commands_run_on_the_quickstarts_outputs"
SLURM_TESTS = "packages/pt-slurm/tests/"
HARNESS_TESTS = "packages/pt-eval/tests/test_pt_eval_inputs.py::test_lm_evaluation_harness_"
# ELSEWHERE: "path::test" (a test that runs the command's shape), or (path, text) where CI's
# script holds the text that runs it.
WIRE_TESTS = "packages/pt-rollout/tests/test_pt_rollout_openai.py::"
ELSEWHERE: dict[str, str | tuple[str, str]] = {
    "uv run pytest": (".ci/run", "\nuv run pytest\n"),
    # two shards of one build, as two processes: the data.yaml of that test's project
    "pt-data build data.yaml --shard 0/2 &": "packages/pt-data/tests/test_pt_data_shards.py::"
    "test_two_shards_in_two_processes_build_the_same_bytes",
    "pt-data build data.yaml --shard 1/2": "packages/pt-data/tests/test_pt_data_shards.py::"
    "test_two_shards_in_two_processes_build_the_same_bytes",
    "bash .ci/setup-slurm.sh": (".ci/run", "for setup in .ci/setup-*.sh; do"),
    "pt-train check ../examples/quickstart/sft.yaml": COMING_FROM,
    "pt-data inspect data/sft -n 1": COMING_FROM,
    "pt-data stats data/sft": COMING_FROM,
    "pt-train plot runs/sft runs/dft --out sft-dft.png --key loss": COMING_FROM,
    "pt-train plot runs/dpo --key eval_loss": COMING_FROM,
    "pt-rollout generate --model - --prompts data/test-prompts --engine hf --n 2 --max-tokens 40"
    " --out samples.jsonl < manifest-sft.json | pt-eval grade -": COMING_FROM,
    "pt-rollout chat - < manifest-sft.json": COMING_FROM,
    "pt-train plot runs/sft runs/dft --out cmp.png --key loss": "tests/test_coming_from.py::test_pt_train_md_plots_the_quickstarts_runs",
    # a real pt-train run (a config, and one with key=value overrides) submitted to the
    # local two-node cluster and followed to its end
    "pt-slurm submit train.yaml": SLURM_TESTS + "test_pt_slurm_train.py::"
    "test_submitted_run_completes_with_config_script_logs_and_inference_checkpoint",
    "pt-slurm submit train.yaml slurm.nodes=4 training.learning_rate=1e-5": SLURM_TESTS
    + "test_pt_slurm_train.py::"
    "test_submitted_run_completes_with_config_script_logs_and_inference_checkpoint",
    "pt-slurm submit pipeline.yaml": SLURM_TESTS + "test_pt_slurm_pipeline.py::"
    "test_the_stages_complete_in_order_each_taking_the_result_before_it",
    "pt-slurm status runs/sft-8b": SLURM_TESTS + "test_pt_slurm_guards.py::"
    "test_status_shows_slurms_reason_for_a_pending_job",
    "pt-slurm logs runs/sft-8b -f": SLURM_TESTS + "test_pt_slurm_jobs.py::"
    "test_early_signal_checkpoints_requeues_and_resumes_as_one_job",
    "pt-slurm cancel runs/sft-8b": SLURM_TESTS + "test_pt_slurm_jobs.py::"
    "test_cancel_stops_the_job_without_a_requeue",
    # lm-evaluation-harness samples files as gsm8k writes them (doc_id, filter, resps)
    "pt-eval grade samples_gsm8k_2025-01-01.jsonl": HARNESS_TESTS + "filters_are_reported_apart",
    "pt-eval grade samples_gsm8k_2025-01-01.jsonl --filter strict-match": HARNESS_TESTS
    + "filter_flag_grades_one_filter",
    "pt-eval grade samples_gsm8k_2025-01-01.jsonl --pred-key resps --gold-key doc.answer"
    " --filter flexible-extract": HARNESS_TESTS + "raw_responses_of_one_filter",
    # a vLLM generator listening for a trainer on another node (here 127.0.0.1, port 0)
    "pt-rollout serve --listen 0.0.0.0:7000 --model ckpt/ --engine vllm": "packages/pt-train/"
    "tests/test_pt_train_colocate.py::test_a_process_on_another_node_takes_the_weights_over_gloo",
    # pt's client through a server (pt's own, on 127.0.0.1, port 0): the rows the engine
    # writes in-process; and pt's server on vLLM beside vllm serve
    "pt-rollout generate --endpoint http://127.0.0.1:8000/v1 --model ckpt --prompts prompts.jsonl"
    " --n 4": WIRE_TESTS + "test_generate_and_score_through_the_server_equal_the_engine_in_process",
    "pt-rollout score --endpoint http://node7:8000/v1 --teacher Qwen/Qwen2.5-7B-Instruct"
    " --tokenizer ckpt --rollouts rollouts.jsonl --top-k 8 --out scores.jsonl": WIRE_TESTS
    + "test_generate_and_score_through_the_server_equal_the_engine_in_process",
    "pt-rollout serve-openai --model ckpt --listen 127.0.0.1:8000 --engine vllm": "packages/"
    "pt-rollout/tests/test_pt_rollout_openai_vllm.py::"
    "test_pt_serve_openai_on_vllm_samples_what_vllm_serve_samples",
    # episodes of an environment (the Guess game of the docs, episode_envs.Guess in the
    # tests), written by generate and shown by inspect
    "pt-rollout generate --model ckpt --prompts rows.jsonl --env guess.py:Guess --n 4"
    " --max-turns 8 --out episodes.jsonl": "packages/pt-rollout/tests/test_pt_rollout_episodes.py"
    "::test_generate_with_an_environment_writes_episodes_and_resumes",
    "pt-data inspect episodes.jsonl --tokenizer ckpt": "packages/pt-data/tests/"
    "test_pt_data_tool_chats.py::test_inspect_shows_an_episode_with_the_environments_tokens_not_trained",
    # a model directory whose tokenizer has no chat template, given ChatML
    "pt-rollout generate --model models/base --prompts prompts.jsonl --chat-template chatml": "tests/test_real_shapes.py::test_rollout_takes_a_chat_template_when_the_model_has_none",
}

PARSE_ONLY = {
    "bash examples/quickstart/run.sh": "the whole quickstart: a `uv sync` of the workspace and "
    "about six minutes of both CPU cores; its steps run at a smaller size in the quickstart_out "
    "fixture, and tests/test_examples.py shellchecks it; here `bash -n` parses it",
}


def run_commands() -> dict[str, tuple[str | None, str]]:
    return {doc: (variant, why) for doc, variant, why in RUN}


def classes() -> dict[str, set[str]]:
    return {
        "RUN": set(run_commands()),
        "SYNOPSIS": SYNOPSIS,
        "ELSEWHERE": set(ELSEWHERE),
        "PARSE_ONLY": set(PARSE_ONLY),
    }


# --- parsing a command line against the CLI ----------------------------------------------


def click_command(tool: str):
    return typer.main.get_command(importlib.import_module(TOOLS[tool]).app)


def stages(text: str) -> list[str]:
    """The stages of a pipeline: split at ``|`` outside a synopsis's brackets."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if text[i : i + 3] == " | " and depth == 0:
            parts.append(text[start:i])
            start = i + 3
    return [*parts, text[start:]]


def segments(text: str) -> list[list[str]]:
    """The words of each stage of a pipeline, without its redirections."""
    stages_words = []
    for stage in stages(text):
        words = shlex.split(stage)
        kept, skip = [], False
        for word in words:
            if skip:
                skip = False
            elif word in ("<", ">", "2>"):
                skip = True
            else:
                kept.append(word)
        stages_words.append(kept)
    return stages_words


def subcommand(words: list[str]):
    """The click command that ``words`` (tool, verb, ...) names, and the arguments after."""
    command, rest = click_command(words[0]), words[1:]
    while hasattr(command, "commands") and rest and rest[0] in command.commands:
        command, rest = command.commands[rest[0]], rest[1:]
    return command, rest


def parse(text: str) -> None:
    """Parse each pt stage of ``text`` as its CLI would: an unknown option, a value of the
    wrong type, a missing or extra argument raises."""
    for words in segments(text):
        if words[0] not in TOOLS:
            continue
        command, args = subcommand(words)
        assert not hasattr(command, "commands"), f"{' '.join(words)}: names no subcommand"
        command.make_context(" ".join(words[:2]), list(args), resilient_parsing=False)


def option_names(command) -> set[str]:
    return {o for p in command.params for o in (*p.opts, *p.secondary_opts)} | {"-h", "--help"}


# --- fast tests: the classification, synopses, mappings and parses ------------------------


def test_every_documented_command_is_in_exactly_one_class():
    found = doc_commands()
    assert len(found) >= 60, found
    unclassified, twice = [], []
    for command in found:
        where = [name for name, members in classes().items() if command.text in members]
        if not where:
            unclassified.append(str(command))
        elif len(where) > 1:
            twice.append(f"{command} in {where}")
    assert not unclassified, "commands in no class of tests/test_docs_commands.py:\n" + "\n".join(
        unclassified
    )
    assert not twice, "\n".join(twice)
    shown = {c.text for c in found}
    stale = {t for members in classes().values() for t in members} - shown
    assert not stale, f"classified but in no doc: {sorted(stale)}"
    assert len(RUN) == len(run_commands()), "a RUN command listed twice"


@pytest.mark.parametrize("text", sorted(SYNOPSIS))
def test_synopsis_names_only_options_its_subcommand_has(text):
    for stage in stages(text):
        words = stage.split()
        command, _ = subcommand(words)
        assert not hasattr(command, "commands"), f"{stage}: names no subcommand"
        named = set(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", stage))
        missing = named - option_names(command)
        assert not missing, f"{stage}: {sorted(missing)} not options of {' '.join(words[:2])}"
        # the --help text shows each of them too
        from typer.testing import CliRunner

        app = importlib.import_module(TOOLS[words[0]]).app
        help_text = CliRunner().invoke(app, [words[1], "--help"]).output
        for name in named - {"-h", "--help"}:
            assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", help_text), name


@pytest.mark.parametrize("text", sorted(ELSEWHERE))
def test_elsewhere_names_a_test_or_ci_step_that_exists(text):
    target = ELSEWHERE[text]
    if isinstance(target, tuple):
        path, needle = target
        assert needle in (REPO / path).read_text(), f"{path} no longer holds {needle!r}"
        if text.startswith("bash "):
            assert (REPO / text.split()[1]).is_file()
        return
    path, name = target.split("::")
    source = (REPO / path).read_text()
    assert re.search(rf"^def {re.escape(name)}\(", source, re.M), f"{target} is no test"
    if text.split()[0] in TOOLS:
        parse(text)


@pytest.mark.parametrize("text", [doc for doc, _, _ in RUN] + sorted(PARSE_ONLY))
def test_the_doc_line_parses_as_written(text):
    """RUN lines as the docs show them (a variant may run) and PARSE_ONLY lines."""
    if text.startswith("bash "):
        script = REPO / text.split()[1]
        check = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr
        assert PARSE_ONLY[text]
        return
    parse(text)
    variant, why = run_commands().get(text, (None, ""))
    if variant is not None:
        assert why and variant != text
        parse(variant)


# --- the run ------------------------------------------------------------------------------


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def docs_dir(quickstart_out, tmp_path_factory):
    """A directory holding the file names the docs' commands use, made from the
    quickstart's outputs: data.yaml and train.yaml (the quickstart's SFT data and model,
    2 steps), checkpoints (ckpt, out/sft/inference/step-500 and models named in the
    commands), prompt files, a benchmarks directory (PT_BENCHMARKS), a prediction file,
    graded rollouts, and runs/grpo: two steps of the quickstart's GRPO, whose dynamic
    sampling logs sampled_reward."""
    out, env = quickstart_out
    work = tmp_path_factory.mktemp("docs-commands")
    for name in ("synth", "tokenizer", "manifest-sft.json"):
        (work / name).symlink_to(out / name)
    (work / "rows.jsonl").symlink_to(out / "synth" / "train.jsonl")
    (work / "data").mkdir()
    (work / "data" / "prompts").symlink_to(out / "data" / "test-prompts")
    sft, dft = out / "runs" / "sft" / "inference" / "step-4", out / "runs" / "dft" / "inference"
    (work / "ckpt").symlink_to(sft)
    (work / "out" / "sft" / "inference").mkdir(parents=True)
    (work / "out" / "sft" / "inference" / "step-500").symlink_to(sft)
    teacher = sorted(dft.iterdir())[-1]
    (work / "teacher").symlink_to(teacher)
    (work / "big").symlink_to(teacher)
    (work / "runs").mkdir()
    shutil.copytree(out / "runs" / "sft", work / "runs" / "sft-tiny",
                    ignore=shutil.ignore_patterns("checkpoints"))  # fmt: skip

    data = yaml.safe_load((QUICKSTART / "data.yaml").read_text())
    data["data"]["output_dir"] = "out/data/sft-mix"
    (work / "data.yaml").write_text(yaml.safe_dump(data))
    train = yaml.safe_load((QUICKSTART / "sft.yaml").read_text())
    train["data"] = {"path": "out/data/sft-mix"}
    train["training"].update(max_steps=2, logging_steps=1)
    del train["training"]["inference_steps"]
    (work / "train.yaml").write_text(yaml.safe_dump(train))

    problems = jsonl(out / "synth" / "test.jsonl")[:3]
    write_jsonl(work / "prompts.jsonl",
                [{"id": p["id"], "prompt": p["problem"], "answer": p["answer"]}
                 for p in problems])  # fmt: skip
    write_jsonl(work / "gsm8k.jsonl",
                [{"question": p["problem"], "answer": f"{p['solution']}\n#### {p['answer']}"}
                 for p in problems])  # fmt: skip
    write_jsonl(work / "my_set.jsonl",
                [{"text": p["problem"], "answer": p["answer"]} for p in problems])  # fmt: skip
    benchmarks = work / "benchmarks"
    write_jsonl(benchmarks / "math_oai" / "test.jsonl",
                [{"problem": p["problem"], "solution": p["solution"], "answer": p["answer"]}
                 for p in problems[:2]])  # fmt: skip
    write_jsonl(benchmarks / "gsm8k" / "test.jsonl", jsonl(work / "gsm8k.jsonl"))

    if SHARED_PREDICTIONS.exists():  # a real model's predictions: 8 per MATH problem, level
        with SHARED_PREDICTIONS.open() as fh:
            rows = [json.loads(next(fh)) for _ in range(12)]
        write_jsonl(work / "predictions.jsonl", rows)
    else:  # the quickstart model's own, with a level column of its own
        sh(f"pt-rollout generate --model ckpt --prompts {work / 'prompts.jsonl'} --n 4"
                 " --max-tokens 16 --out raw.jsonl", work, env)  # fmt: skip
        rows = jsonl(work / "raw.jsonl")
        write_jsonl(work / "predictions.jsonl", [{**r, "level": "Level 1"} for r in rows])

    # graded rollouts for `pt-data pairs grades.jsonl`: two samples of each problem, its
    # worked solution and the same with a wrong final answer, in the quickstart's tokens,
    # graded by pt-eval (a 4-step model has no correct sample of its own to pair)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(out / "tokenizer"))
    samples = []
    for p in problems:
        wrong = p["solution"].replace(f"{{{p['answer']}}}", f"{{{int(p['answer']) + 1}}}")
        for sample, completion in enumerate((p["solution"], wrong)):
            samples.append(
                {
                    "id": p["id"],
                    "sample": sample,
                    "prompt": p["problem"],
                    "completion": completion,
                    "answer": p["answer"],
                    "prompt_token_ids": tokenizer(p["problem"])["input_ids"],
                    "completion_token_ids": tokenizer(completion)["input_ids"],
                }
            )
    write_jsonl(work / "samples-of-two.jsonl", samples)
    graded = manifest(sh("pt-eval grade samples-of-two.jsonl --out grades.jsonl", work, env))
    assert graded["correct"] == len(problems), graded

    grpo = yaml.safe_load((QUICKSTART / "grpo.yaml").read_text())
    grpo["model"]["name_or_path"] = str(sft)
    grpo["rollout"].update(prompts="data/prompts", samples_per_prompt=4, max_tokens=8)
    grpo["training"].update(global_batch_size=8, micro_batch_size=8, max_steps=2)
    (work / "grpo-setup.yaml").write_text(yaml.safe_dump(grpo))
    sh("pt-train run grpo-setup.yaml", work, env)
    env = {**env, "PT_BENCHMARKS": str(benchmarks)}
    return work, env


def manifest(proc: subprocess.CompletedProcess) -> dict:
    return json.loads(proc.stdout.strip().splitlines()[-1])


def check(doc: str, proc: subprocess.CompletedProcess, work: Path) -> None:
    """What each command is documented to leave, checked where it is cheap to."""
    if doc.startswith("pt-data synth"):
        assert len(jsonl(work / "data" / "arith" / "train.jsonl")) == 2000
    elif doc.startswith("pt-data tokenizer"):
        assert manifest(proc)["kind"] == "tokenizer" and (work / "tok").is_dir()
    elif doc == "pt-data templates":
        assert "chatml" in proc.stdout + proc.stderr
    elif doc.startswith("pt-data build") and " | " not in doc:
        m = manifest(proc)
        assert m["kind"] == "dataset" and m["rows"] > 0
        assert Path(m["path"]) == work / "out" / "data" / "sft-mix"
    elif doc.startswith("pt-data stats"):
        assert (work / "lengths.png").stat().st_size > 0
    elif doc.startswith("pt-data pairs"):
        assert manifest(proc)["kind"] == "dataset" and manifest(proc)["rows"] > 0
    elif doc.startswith("pt-train plot runs/sft-tiny"):
        for name in ("loss.png", "lr.png"):
            assert (work / "runs" / "sft-tiny" / name).stat().st_size > 0
    elif doc.startswith("pt-train plot runs/grpo"):
        assert (work / "runs" / "grpo" / "sampled_reward.png").stat().st_size > 0
    elif doc.startswith("pt-train push"):
        assert list((work / "runs" / "sft-tiny" / "inference").glob("step-*/README.md"))
    elif doc.startswith("pt-slurm submit") and "--dry-run" in doc:
        assert "#SBATCH" in proc.stdout and "pt-train run" in proc.stdout
    elif stages(doc)[-1].startswith(("pt-eval grade", "pt-eval run")):
        m = manifest(proc)
        assert m["kind"] == "grades" and m["samples"] > 0, m
        if "--group-key level" in doc:
            assert "level" in proc.stderr.lower()
        if "--n 16" in doc:
            assert m["samples"] == 16 * m["problems"]
    elif doc.startswith("pt-train run") and " | " not in doc:
        m = manifest(proc)
        assert m["kind"] == "checkpoint" and m["step"] == 2
        if "run_name=dft" in doc:
            assert (
                yaml.safe_load((work / "runs" / "dft" / "config.yaml").read_text())["objective"][
                    "name"
                ]
                == "dft"
            )
    elif doc == PIPE_INTO_TRAINING:
        assert manifest(proc)["kind"] == "checkpoint"
        assert (work / "runs" / "sft" / "metrics.jsonl").exists()
    elif doc.startswith("pt-rollout score"):
        assert jsonl(work / "scores.jsonl")
    elif "pt-rollout" in doc:
        assert manifest(proc)["kind"] in ("rollouts", "scores"), manifest(proc)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the session's quickstart_out may be built first, here
def test_the_run_commands_run_as_documented(docs_dir):
    work, env = docs_dir
    for doc, variant, _ in RUN:
        if doc in FRESH_START:
            shutil.rmtree(work / FRESH_START[doc])
        proc = sh(variant or doc, work, env)
        check(doc, proc, work)
