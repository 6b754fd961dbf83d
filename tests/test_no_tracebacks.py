"""Every verb of pt, pt-train and pt-rollout given bad input (a missing path, a run
directory where a checkpoint goes, a mistyped flag, a value of the wrong type, empty and
malformed files) ends the same way: exit code 2, one `error:` line that names the
problem, nothing on stdout, no traceback, and no output started."""

from __future__ import annotations

import json
import shutil

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_model_dir, tiny_tokenizer_dir):
    root = tmp_path_factory.mktemp("bad-input")
    (root / "empty.yaml").write_text("")
    (root / "broken.yaml").write_text("training: [1,\n")
    (root / "empty.jsonl").write_text("")
    (root / "broken.jsonl").write_text('not json\n{"a": 1}\n')
    (root / "prompts.jsonl").write_text('{"id": 1, "prompt": "1+1="}\n')
    (root / "ok.yaml").write_text(
        f"run_name: ok\noutput_dir: {root / 'runs'}\n"
        f"model:\n  init:\n    tokenizer: {tiny_tokenizer_dir}\n"
        "    hidden_size: 64\n    num_layers: 1\n    num_heads: 1\n"
        "training:\n  max_steps: 1\n  global_batch_size: 1\n  micro_batch_size: 1\n"
    )
    run = root / "run"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copytree(tiny_model_dir, run / "inference" / "step-3")
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0, "lr": 0.001}\n')
    for name, text in (("run-empty", ""), ("run-broken", 'not json\n{"step": 2}\n')):
        (root / name).mkdir()
        (root / name / "metrics.jsonl").write_text(text)
    return root


def cases(root, model):
    """(command line, stdin, what the error line says). {r} is the fixture's directory."""
    run, step = root / "run", root / "run" / "inference" / "step-3"
    ok, prompts = root / "ok.yaml", root / "prompts.jsonl"
    dataset = json.dumps({"kind": "dataset", "path": str(prompts)})
    gen = ["pt-rollout", "generate", "--engine", "hf"]
    score = ["pt-rollout", "score", "--engine", "hf"]
    return [
        # the umbrella
        (["pt", "bogus"], None, "pt: No such command 'bogus'"),
        (["pt", "env", "--bogus"], None, "pt env: No such option: --bogus"),
        (["pt", "train", "run", root / "missing.yaml"], None, "missing.yaml: config file not found"),
        (["pt", "data", "build", root / "empty.yaml"], None, "no 'data:' section"),
        (["pt", "eval", "grade", root / "missing.jsonl"], None, "no such file or directory"),
        (["pt", "slurm", "submit", root / "missing.yaml"], None, "config file not found"),
        (["pt", "rollout", "generate", "--model", run, "--prompts", prompts], None,
         f"a pt-train run directory, not a checkpoint; its latest inference checkpoint is {step}"),
        # pt-train run
        (["pt-train", "run", root / "missing.yaml"], None, "missing.yaml: config file not found"),
        (["pt-train", "run", root], None, "is a directory; expected a YAML file"),
        (["pt-train", "run", root / "broken.yaml"], None, "broken.yaml:2: invalid YAML"),
        (["pt-train", "run", root / "empty.yaml"], None, "problem(s) in the config"),
        (["pt-train", "run", ok, "--forse-resume"], None, "No such option: --forse-resume"),
        (["pt-train", "run", ok, "--force-resume", "true"], None, "override 'true' has no '='"),
        (["pt-train", "run", ok, "training.max_steps=abc"], None, "expected int"),
        (["pt-train", "run", ok, "--data", root / "missing.jsonl"], None, "no such file"),
        (["pt-train", "run", ok, "--data", "-"], "", "no manifest on stdin"),
        (["pt-train", "run", ok, "--data", root / "empty.jsonl"], None, "empty.jsonl: no rows"),
        (["pt-train", "run", ok, "--data", root / "broken.jsonl"], None,
         "broken.jsonl:1: malformed JSON line"),
        # pt-train init, check, plot
        (["pt-train", "init", root / "missing.yaml"], None, "config file not found"),
        (["pt-train", "init", root / "broken.yaml"], None, "invalid YAML"),
        (["pt-train", "init", ok, "--bogus"], None, "No such option: --bogus"),
        (["pt-train", "check", root / "empty.yaml"], None, "problem(s) in the config"),
        (["pt-train", "check", ok, "training.global_batch_size=abc"], None, "expected int"),
        (["pt-train", "plot", root / "missing"], None, "missing: no such directory"),
        (["pt-train", "plot", step], None, "step-3: no metrics.jsonl"),
        (["pt-train", "plot", root / "run-empty"], None, "metrics.jsonl is empty"),
        (["pt-train", "plot", root / "run-broken"], None, "metrics.jsonl:1: malformed metrics"),
        (["pt-train", "plot", run, "--key", "nope"], None, "no run logged 'nope'"),
        (["pt-train", "plot", run, root / "run-broken"], None, "2 runs to compare, and no --out"),
        # pt-rollout generate
        ([*gen, "--model", root / "no" / "such", "--prompts", prompts], None,
         "--model " + str(root / "no" / "such") + ": no such directory"),
        ([*gen, "--model", run, "--prompts", prompts], None, "a pt-train run directory"),
        ([*gen, "--model", root, "--prompts", prompts], None, "not a model directory"),
        ([*gen, "--model", step / "config.json", "--prompts", prompts], None, "is a file"),
        ([*gen, "--model", "-", "--prompts", "-"], "", "--model and --prompts are both '-'"),
        ([*gen, "--model", "-", "--prompts", prompts], "", "no manifest on stdin"),
        ([*gen, "--model", "-", "--prompts", prompts], dataset, "of kind 'dataset'"),
        ([*gen, "--model", model, "--prompts", prompts, "--n", "abc"], None,
         "Invalid value for '--n'"),
        ([*gen, "--modle", model, "--prompts", prompts], None, "No such option: --modle"),
        ([*gen, "--model", model, "--prompts", root / "missing.jsonl"], None, "no such file"),
        ([*gen, "--model", model, "--prompts", root / "empty.jsonl"], None, "no prompt rows"),
        ([*gen, "--model", model, "--prompts", root / "broken.jsonl"], None,
         "broken.jsonl:1: malformed JSON line"),
        # pt-rollout score
        ([*score, "--teacher", root / "missing", "--rollouts", prompts], None,
         "--teacher " + str(root / "missing") + ": no such directory"),
        ([*score, "--teacher", run, "--rollouts", prompts], None, "a pt-train run directory"),
        ([*score, "--teacher", "-", "--rollouts", "-"], "", "--teacher and --rollouts are both"),
        ([*score, "--teacher", model, "--rollouts", root / "missing.jsonl"], None, "no such file"),
        ([*score, "--teacher", model, "--rollouts", root / "empty.jsonl"], None, "no rollout rows"),
        ([*score, "--teacher", model, "--rollouts", root / "broken.jsonl"], None,
         "broken.jsonl:1: malformed JSON line"),
        ([*score, "--teacher", model, "--rollouts", prompts, "--top-k", "abc"], None,
         "Invalid value for '--top-k'"),
    ]  # fmt: skip


def test_bad_input_is_one_error_line_and_exit_2(files, tiny_model_dir, tmp_path, cli):
    workdir = tmp_path / "cwd"  # outputs default to the working directory
    workdir.mkdir()
    failures = []
    for args, stdin, expected in cases(files, tiny_model_dir):
        proc = cli(*args, input=stdin, check=False, cwd=workdir, env={"OMP_NUM_THREADS": "1"})
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        problems = []
        if proc.returncode != 2:
            problems.append(f"exit {proc.returncode}")
        if "Traceback" in proc.stderr:
            problems.append("traceback")
        if proc.stdout:
            problems.append(f"stdout {proc.stdout!r}")
        if len(errors) != 1 or expected not in errors[0]:
            problems.append(f"error lines {errors}, expected one with {expected!r}")
        if args[0] in ("pt-train", "pt-rollout") and "--skip-bad" in proc.stderr:
            problems.append("names --skip-bad, which this tool does not have")
        if list(workdir.iterdir()):
            problems.append(f"left {[p.name for p in workdir.iterdir()]}")
            shutil.rmtree(workdir)
            workdir.mkdir()
        if problems:
            failures.append(f"{' '.join(map(str, args))}: {'; '.join(problems)}\n{proc.stderr}")
    assert not failures, "\n\n".join(failures)
