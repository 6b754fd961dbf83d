"""Every recipe under examples/ is a config the tools accept, even where its hardware is
absent: data configs by pt-data's schema, training configs by `pt-train check` and the batch
layout of the world size they are meant for, and the SLURM recipe by a dry run whose script
passes shellcheck."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from shell import sh

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
DATA_CONFIGS = (
    sorted(EXAMPLES.glob("*/data.yaml"))
    + sorted(EXAMPLES.glob("*/*prompts.yaml"))
    + [EXAMPLES / "quickstart" / "offpolicy-data.yaml"]
)
QUICKSTART_TRAIN = ("sft", "finetune", "dpo", "opd", "grpo")
TRAIN_CONFIGS = sorted(EXAMPLES.glob("*/train.yaml")) + [
    EXAMPLES / "quickstart" / f"{name}.yaml" for name in QUICKSTART_TRAIN
]


def assert_shellcheck_passes(*scripts: Path) -> None:
    shellcheck = shutil.which("shellcheck") or str(Path(sys.executable).with_name("shellcheck"))
    check = subprocess.run([shellcheck, *map(str, scripts)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout


def _ids(paths):
    return [str(p.relative_to(EXAMPLES)) for p in paths]


def test_every_example_folder_has_a_readme_and_a_config():
    folders = [p for p in EXAMPLES.iterdir() if p.is_dir()]
    assert len(folders) >= 4
    for folder in folders:
        assert list(folder.glob("*.yaml")), f"{folder} has no config"
        if folder.name != "quickstart":
            assert (folder / "README.md").exists(), f"{folder} has no README.md"


@pytest.mark.parametrize("path", DATA_CONFIGS, ids=_ids(DATA_CONFIGS))
def test_data_configs_validate(path):
    from pt_data.config import load_data_config
    from pt_data.transforms import get_transform

    cfg = load_data_config(path)
    for dataset in cfg.datasets:
        get_transform(dataset.transform_name)  # raises on an unknown transform


@pytest.mark.parametrize("path", TRAIN_CONFIGS, ids=_ids(TRAIN_CONFIGS))
def test_train_configs_pass_pt_train_check_at_their_world_size(cli, path):
    from pt_train.config import batch_layout, load_train_config

    cli("pt-train", "check", path)
    cfg = load_train_config(path)
    slurm = cfg.slurm or {}
    world = slurm.get("nodes", 1) * slurm.get("gpus_per_node", 0) or cfg.launcher.nproc
    accumulation = batch_layout(cfg.training, world)
    assert accumulation >= 1


def test_the_two_node_recipe_renders_a_script_that_passes_shellcheck(cli, tmp_path):
    recipe = EXAMPLES / "dft-slurm-2node" / "train.yaml"
    proc = cli("pt-slurm", "submit", recipe, "--dry-run", cwd=tmp_path)
    script = proc.stdout
    assert "#SBATCH --nodes=2" in script and "#SBATCH --gpus-per-node=8" in script
    assert "--signal=B:USR1@300" in script
    assert "scontrol show hostnames" in script
    assert not list(tmp_path.iterdir()), "a dry run writes nothing"
    (tmp_path / "job.sh").write_text(script)
    assert_shellcheck_passes(tmp_path / "job.sh")


def test_recipes_follow_the_dft_papers_setting():
    """lr 5e-5, effective batch 256, max length 2048, 1 epoch, warmup 0.1, cosine."""
    train = yaml.safe_load((EXAMPLES / "dft-qwen2.5-math" / "train.yaml").read_text())
    data = yaml.safe_load((EXAMPLES / "dft-qwen2.5-math" / "data.yaml").read_text())
    t = train["training"]
    assert (
        train["objective"]["name"],
        t["learning_rate"],
        t["global_batch_size"],
        t["num_epochs"],
    ) == (
        "dft",
        5e-5,
        256,
        1,
    )
    assert (t["warmup_ratio"], t["lr_schedule"]) == (0.1, "cosine")
    assert data["data"]["tokenizer"]["max_seq_length"] == 2048
    two_node = yaml.safe_load((EXAMPLES / "dft-slurm-2node" / "train.yaml").read_text())
    assert two_node["objective"] == train["objective"]
    for key in ("learning_rate", "global_batch_size", "num_epochs", "warmup_ratio"):
        assert two_node["training"][key] == t[key], key


def test_the_quickstart_scripts_pass_shellcheck():
    assert_shellcheck_passes(
        *(EXAMPLES / "quickstart" / n for n in ("run.sh", "grpo-longer.sh", "opd-longer.sh"))
    )


LONGER = [("grpo-longer.sh", "PT_GRPO_STEPS", "abc"), ("opd-longer.sh", "PT_OPD_STEPS", "0"),
          ("opd-longer.sh", "PT_OPD_PROBLEMS", "-8")]  # fmt: skip


@pytest.mark.parametrize(("script", "variable", "bad"), LONGER[:2], ids=[s for s, *_ in LONGER[:2]])
def test_a_longer_script_without_a_quickstart_output_says_what_to_run(
    tmp_path, script, variable, bad
):
    proc = subprocess.run(
        ["bash", str(EXAMPLES / "quickstart" / script)],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "no quickstart output" in proc.stderr and "examples/quickstart/run.sh" in proc.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(("script", "variable", "bad"), LONGER, ids=[v for _, v, _ in LONGER])
def test_a_longer_script_names_a_bad_step_count_before_it_writes(tmp_path, script, variable, bad):
    proc = subprocess.run(
        ["bash", str(EXAMPLES / "quickstart" / script)],
        capture_output=True, text=True, cwd=tmp_path,
        env={**os.environ, variable: bad},
    )  # fmt: skip
    assert proc.returncode == 2
    what = "problems" if variable == "PT_OPD_PROBLEMS" else "steps"
    assert proc.stderr.splitlines()[0] == f"error: {variable}={bad} is not a number of {what}"
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(("variable", "bad", "what"), [
    ("PT_QUICKSTART_SFT_SEED", "x1", "a seed"), ("PT_QUICKSTART_SFT_SEED", "-1", "a seed"),
    ("PT_QUICKSTART_SAMPLES", "0", "a number of samples"),
    ("PT_QUICKSTART_SAMPLES", "eight", "a number of samples"),
])  # fmt: skip
def test_the_quickstart_names_a_bad_knob_before_it_installs_or_writes(tmp_path, variable, bad,
                                                                      what):  # fmt: skip
    proc = subprocess.run(
        ["bash", str(EXAMPLES / "quickstart" / "run.sh")],
        capture_output=True, text=True, cwd=tmp_path,
        env={**os.environ, variable: bad, "PT_QUICKSTART_OUT": str(tmp_path / "out")},
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[0] == f"error: {variable}={bad} is not {what}"
    assert len(proc.stderr.splitlines()) == 2 and "install" not in proc.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_opd_longer_runs_both_distillations_and_draws_their_curves(quickstart_out, tmp_path):
    """opd-longer.sh on a copy of the session's small quickstart output (its SFT run's
    step 2 as the student, step 4 as the teacher), for 2 steps of 8 problems: OPD and SFT on the
    teacher's samples each write checkpoints, every one is graded, and the curve of
    accuracy against the student tokens trained on is drawn from the runs' own counts."""
    out, env = quickstart_out
    work = tmp_path / "quickstart-out"
    shutil.copytree(out, work, symlinks=True)
    for command in (
        f"pt-data build {EXAMPLES}/quickstart/train-prompts.yaml",
        *(
            f"pt-rollout generate --model runs/sft/inference/step-{step} --prompts "
            f"data/test-prompts --engine hf --n 4 --temperature 0.6 --max-tokens 40 --seed 0 "
            f"| pt-eval grade - > grades-{name}.json"
            for name, step in (("base", 2), ("sft", 4))
        ),
    ):
        sh(command, work, env)
    proc = sh(
        f"bash {EXAMPLES}/quickstart/opd-longer.sh",
        tmp_path,  # the script's quickstart-out/ is in the directory it runs from
        {**env, "PT_OPD_STEPS": "2", "PT_OPD_PROBLEMS": "8",
         "PT_OPD_STUDENT": "runs/sft/inference/step-2",
         "PT_OPD_TEACHER": "runs/sft/inference/step-4"},
    )  # fmt: skip
    result = json.loads((work / "opd-longer.json").read_text())
    base = json.loads((work / "grades-base.json").read_text())["accuracy"]
    for run in ("opd-longer", "offpolicy-longer"):
        points = result[run]
        assert points[0] == {"tokens": 0, "accuracy": base}
        lines = (work / "runs" / run / "metrics.jsonl").read_text().splitlines()
        metrics = [json.loads(line) for line in lines]
        assert points[-1]["tokens"] == metrics[-1]["trained_tokens"] > 0
        assert [p["tokens"] for p in points] == sorted({p["tokens"] for p in points})
    # the teacher sampled two answers to each of 2 x 8 / 2 problems: OPD's sample count
    samples = (work / "rollouts" / "teacher-samples.jsonl").read_text().splitlines()
    assert len(samples) == 2 * 8
    assert (work / "opd-longer.png").stat().st_size > 10_000
    assert "OPD ends at" in proc.stdout and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_the_dft_recipe_on_a_base_qwen2_shaped_model(cli, tmp_path, qwen2_model_dir):
    """The recipe's own data.yaml and train.yaml, run as its README says on a base
    Qwen2-shaped model of the real-shape fixture (EOS <|endoftext|>, its own template with
    another system turn), with NuminaMath-shaped rows and CPU-sized overrides: the rows are
    the recipe's ChatML, and the checkpoint carries that template and ends turns with
    <|im_end|>, which every generator then stops on."""
    from transformers import AutoTokenizer, GenerationConfig

    from pt_rollout.prompts import stop_token_ids

    recipe = tmp_path / "recipe"
    shutil.copytree(EXAMPLES / "dft-qwen2.5-math", recipe)
    rows = [
        {
            "problem": f"What is {i} + {i}?",
            "solution": f"{i} + {i} = {2 * i}, so $\\boxed{{{2 * i}}}$.",
        }
        for i in range(8)
    ]
    (recipe / "numina.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = cli(
        "pt-data", "build", "data.yaml", f"data.datasets.0.source={recipe / 'numina.jsonl'}",
        f"data.tokenizer.name_or_path={qwen2_model_dir}",
        cwd=recipe,
    )  # fmt: skip
    info = json.loads((recipe / "out/data/numina-100k/dataset.json").read_text())["tokenizer"]
    template = (recipe / "chatml-math.jinja").read_text()
    assert info["template"] == template and info["end_of_turn"] == ["<|im_end|>"]
    trained = cli(
        "pt-train", "run", "train.yaml", "--data", "-", f"model.name_or_path={qwen2_model_dir}",
        "model.attn_implementation=sdpa", "training.precision=fp32",
        "training.global_batch_size=2", "training.micro_batch_size=1", "launcher.nproc=1",
        "deepspeed.zero_stage=0", "data.shuffle=false", input=data.stdout, cwd=recipe,
    )  # fmt: skip
    checkpoint = json.loads(trained.stdout.strip().splitlines()[-1])["path"]
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    assert tokenizer.chat_template == template and tokenizer.eos_token == "<|im_end|>"
    assert GenerationConfig.from_pretrained(checkpoint).eos_token_id == [151645, 151643]
    assert 151645 in stop_token_ids(checkpoint, tokenizer)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 1 + 1?"}], add_generation_prompt=True, tokenize=False
    )
    assert prompt.startswith("<|im_start|>system\nPlease reason step by step")
