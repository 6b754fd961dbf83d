"""`pt-train push RUN_DIR`: a Hugging Face model card (README.md) in the run's last inference
checkpoint, saying what the run trained from and how; with --repo-id the checkpoint is
uploaded, which needs the hub: offline, the command stops with one line before any work.
(The upload itself needs a network and a token, and is not tested here.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow  # one short training run, then pt-train push


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_run_config, pt_train_run):
    """Two SFT steps on a dataset directory with a validation split, evaluated each step."""
    root = tmp_path_factory.mktemp("push")
    for split, n in (("train", 16), ("validation", 4)):
        (root / "data" / split).mkdir(parents=True)
        with open(root / "data" / split / "rows.jsonl", "w") as fh:
            for i in range(n):
                ids = [5 + (i * 13 + j) % 250 for j in range(10 + i % 5)]
                fh.write(json.dumps({"input_ids": ids, "labels": ids}) + "\n")
    config = tiny_run_config(
        root / "runs", root / "data", {"name": "sft"},
        learning_rate=1e-3, global_batch_size=4, micro_batch_size=4, max_steps=2,
    )  # fmt: skip
    config["eval"] = {"steps": 1}
    (root / "train.yaml").write_text(yaml.safe_dump(config))
    code, _, err = pt_train_run(root / "train.yaml", "run").finish()
    assert code == 0, err
    return root / "runs" / "run"


def test_the_card_names_base_data_objective_config_and_final_metrics(run_dir, cli):
    proc = cli("pt-train", "push", run_dir)
    card_path = run_dir / "inference" / "step-2" / "README.md"
    assert f"wrote {card_path}" in " ".join(proc.stderr.split())
    card = card_path.read_text()

    _, front, body = card.split("---\n", 2)
    assert yaml.safe_load(front) == {
        "library_name": "transformers",
        "pipeline_tag": "text-generation",
        "tags": ["pt", "sft"],
    }  # model.init: no hub model to name as base_model
    assert "## Base model\n\nRandomly initialised (llama, `model.init`)" in body
    fingerprint = json.loads((run_dir / "data_fingerprint.json").read_text())
    assert "## Data\n\n`.../data`" in body
    assert f"Fingerprint `{fingerprint['digest']}` (split `train`)." in body
    assert "## Objective\n\n```yaml\nname: sft\n" in body

    # the resolved config, as frozen in the run directory, its local paths by their names
    config_block = body.split("## Training config")[1].split("```yaml\n")[1].split("```")[0]
    frozen = yaml.safe_load((run_dir / "config.yaml").read_text())
    for section, key in (("data", "path"), ("model", "init")):
        if key == "init":
            tokenizer = Path(frozen["model"]["init"]["tokenizer"])
            frozen["model"]["init"]["tokenizer"] = f".../{tokenizer.name}"
        else:
            frozen[section][key] = f".../{Path(frozen[section][key]).name}"
    frozen["output_dir"] = ".../runs"
    assert yaml.safe_load(config_block) == frozen
    # the card is published: no directory of the machine that trained appears in it
    assert str(run_dir.parent.parent) not in card and str(Path.home()) not in card

    # the last step's metrics and the last evaluation's, as metrics.jsonl has them
    last = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][-1]
    assert last["step"] == 2 and last["eval_loss"] is not None
    assert f"| loss | {last['loss']:.6g} |" in body
    assert f"| eval_loss (step 2) | {last['eval_loss']:.6g} |" in body


def test_offline_an_upload_stops_with_one_line_before_any_work(run_dir, cli):
    card = run_dir / "inference" / "step-2" / "README.md"
    card.unlink(missing_ok=True)
    proc = cli(
        "pt-train", "push", run_dir, "--repo-id", "me/tiny", env={"HF_HUB_OFFLINE": "1"},
        check=False,
    )  # fmt: skip
    err = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and "Traceback" not in err
    assert "error: HF_HUB_OFFLINE is set: the hub is off, nothing can be uploaded" in err
    assert "fix: unset HF_HUB_OFFLINE to upload, or leave out --repo-id" in err
    assert not card.exists()  # nothing written


def test_a_run_without_an_inference_checkpoint_is_refused(tmp_path, cli):
    (tmp_path / "config.yaml").write_text("run_name: x\n")
    proc = cli("pt-train", "push", tmp_path, check=False)
    assert proc.returncode == 2
    assert f"error: {tmp_path}: no inference checkpoint (inference/step-N)" in " ".join(
        proc.stderr.split()
    )


@pytest.mark.parametrize(
    ("checkpoint", "says", "fix"),
    [
        ("inference/step-2", "is an inference checkpoint, not a run directory",
         "push its run with this checkpoint: pt-train push {run} --checkpoint {path}"),
        ("checkpoints/step-2", "is a full checkpoint (for resuming), not a run directory",
         "push its run, whose last inference checkpoint is published: pt-train push {run}"),
    ],
    ids=["inference", "full"],
)  # fmt: skip
def test_a_checkpoint_given_for_the_run_names_the_run_directory(
    run_dir, cli, checkpoint, says, fix
):
    """`pt-train push RUN/inference/step-2` (what `pt-train run` prints as its manifest's
    path) is refused before any work, with the command that pushes it."""
    path = run_dir / checkpoint
    (path / "README.md").unlink(missing_ok=True)
    proc = cli("pt-train", "push", path, check=False)
    err = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and "Traceback" not in err
    assert f"error: {path} {says}" in err
    assert "fix: " + fix.format(run=run_dir, path=path) in err
    assert not (path / "README.md").exists()
