"""The online loop (rollout.prompts): rounds generated from the policy being trained, a
teacher's scores, schedules and their staleness, resuming mid-round, and a vLLM generator
that takes new weights in place."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from pt_core.contracts import REQUEUE_EXIT_CODE
from pt_train.config import TrainConfig
from pt_train.metrics import read_metrics
from pt_train.trainer import train

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_tokenizer):
    """A student and a teacher (tiny Llamas of different seeds) and 12 prompts."""
    from pt_train.model import build_llama

    root = tmp_path_factory.mktemp("online")
    for name, seed in (("student", 0), ("teacher", 1)):
        model = build_llama(tiny_tokenizer, hidden_size=128, num_layers=2, num_heads=2, seed=seed)
        model.save_pretrained(root / name)
        tiny_tokenizer.save_pretrained(root / name)
    with open(root / "prompts.jsonl", "w") as fh:
        for i in range(12):
            fh.write(json.dumps({"id": f"p{i}", "prompt": f"What is {i} + {2 * i}?"}) + "\n")
    return root


def config(world: Path, name: str, steps: int = 4, **rollout) -> dict:
    return {
        "run_name": name,
        "output_dir": str(world / "runs"),
        "model": {"name_or_path": str(world / "student")},
        "objective": {
            "name": "opd",
            "loss": "forward_kl",
            "teacher": {"path": str(world / "teacher"), "top_k": 4},
        },
        "rollout": {
            "prompts": str(world / "prompts.jsonl"),
            "samples_per_prompt": 2,
            "max_tokens": 8,
            "temperature": 1.0,
            **rollout,
        },
        "training": {
            "seed": 0,
            "learning_rate": 1e-3,
            "lr_schedule": "constant",
            "global_batch_size": 4,
            "micro_batch_size": 2,
            "max_steps": steps,
        },
    }


def run(world: Path, name: str, **kwargs) -> list[dict]:
    train(TrainConfig.model_validate(config(world, name, **kwargs)))
    return read_metrics(world / "runs" / name)


def rounds(world: Path, name: str) -> list[list[dict]]:
    root = world / "runs" / name / "rounds"
    return [
        [json.loads(x) for x in (d / "rollouts.jsonl").read_text().splitlines()]
        for d in sorted(root.iterdir())
    ]


def weights(world: Path, name: str, step: int) -> dict:
    return load_file(world / "runs" / name / "inference" / f"step-{step}" / "model.safetensors")


def test_sync_rounds_are_sampled_from_the_current_weights(world):
    """2 updates per round, 4 steps: 2 rounds of 4 prompts x 2 samples, each generated at
    the start of its round (weight version 0 and 2) and so staleness 0 throughout."""
    metrics = run(world, "sync", updates_per_round=2)
    assert [m["round"] for m in metrics] == [0, 0, 1, 1]
    assert all(m["staleness_mean"] == m["staleness_max"] == 0 for m in metrics)
    made = rounds(world, "sync")
    assert [len(r) for r in made] == [8, 8]
    assert [{row["weight_version"] for row in r} for r in made] == [{0}, {2}]
    row = made[0][0]
    # what the loss needs came with the round: the teacher's top-4 of every completion token
    assert len(row["teacher_topk_ids"]) == len(row["completion_token_ids"])
    assert all(len(k) == 4 for k in row["teacher_topk_ids"])
    assert len(row["completion_logprobs"]) == len(row["completion_token_ids"])
    # two samples of each of 4 prompts, prompts differing between rounds
    assert sorted({r["id"] for r in made[0]}) != sorted({r["id"] for r in made[1]})
    assert all(m["kl"] is not None and m["sampled_kl"] is not None for m in metrics)
    # every sample fresh: the loss on fresh samples is the step's loss, none is stale
    assert [m["loss_fresh"] for m in metrics] == pytest.approx([m["loss"] for m in metrics])
    assert all(m["loss_stale"] is None for m in metrics)


def test_opd_with_a_task_reward_adds_its_term_to_the_distillation_loss(world, monkeypatch):
    """reward_weight 1 with a reward function (a tenth of the completion's characters):
    the first step trains on the same samples as plain OPD (per-sample seeds), so its loss
    is plain OPD's plus the logged reward term, its KL the same; the weights then differ."""
    (world / "opd_rewards.py").write_text(
        "def length(rows):\n    return [len(r['completion']) / 10 for r in rows]\n"
    )
    monkeypatch.syspath_prepend(str(world))
    plain = run(world, "opd-plain", steps=2)
    cfg = config(world, "opd-reward", steps=2)
    cfg["objective"]["reward_weight"] = 1.0
    cfg["reward"] = {"function": "opd_rewards:length"}
    train(TrainConfig.model_validate(cfg))
    mixed = read_metrics(world / "runs" / "opd-reward")
    first, base = mixed[0], plain[0]
    assert first["kl"] == pytest.approx(base["kl"], rel=1e-6)
    assert first["reward_loss"] != 0.0
    assert first["loss"] == pytest.approx(base["loss"] + first["reward_loss"], rel=1e-6)
    assert all(m["reward"] is not None for m in mixed) and "reward" not in base
    a, b = weights(world, "opd-plain", 2), weights(world, "opd-reward", 2)
    assert any(not torch.equal(a[k], b[k]) for k in a)


def tempered_forward_kl(world: Path, rows: list[dict], temperature: float) -> float:
    """OPD's forward KL over the teacher's top 4 and the mass outside them, written out: the
    student (its starting weights) and the teacher run here on each row's prompt and
    completion, both distributions at ``temperature``, averaged over the completion tokens."""
    from transformers import AutoModelForCausalLM

    models = {
        n: AutoModelForCausalLM.from_pretrained(world / n).eval() for n in ("student", "teacher")
    }
    total, count = 0.0, 0
    for row in rows:
        ids = torch.tensor([row["prompt_token_ids"] + row["completion_token_ids"]])
        n, p = len(row["completion_token_ids"]), len(row["prompt_token_ids"])
        with torch.no_grad():
            logps = {k: torch.log_softmax(m(ids).logits[0, p - 1 : p - 1 + n].double() / temperature, -1)
                     for k, m in models.items()}  # fmt: skip
        top = logps["teacher"].topk(4, -1).indices  # [n, 4]
        t, s = logps["teacher"].gather(-1, top), logps["student"].gather(-1, top)
        t_rest = torch.log1p(-t.exp().sum(-1))
        s_rest = torch.log1p(-s.exp().sum(-1))
        kl = (t.exp() * (t - s)).sum(-1) + t_rest.exp() * (t_rest - s_rest)
        total, count = total + float(kl.sum()), count + n
    return total / count


def completion_logps(world: Path, model: str, row: dict, temperature: float) -> torch.Tensor:
    """``model``'s log-probs (at ``temperature``) of every next token over a round row's
    completion, worked out here: ``[completion tokens, vocabulary]``."""
    from transformers import AutoModelForCausalLM

    net = AutoModelForCausalLM.from_pretrained(world / model).eval()
    ids = torch.tensor([row["prompt_token_ids"] + row["completion_token_ids"]])
    n, p = len(row["completion_token_ids"]), len(row["prompt_token_ids"])
    with torch.no_grad():
        return torch.log_softmax(net(ids).logits[0, p - 1 : p - 1 + n] / temperature, -1)


def assert_teacher_topk(world: Path, row: dict, temperature: float) -> None:
    """The row's teacher top-4 ids and log-probs are the teacher's at ``temperature``."""
    top = completion_logps(world, "teacher", row, temperature).topk(4, -1)
    assert row["teacher_topk_ids"] == top.indices.tolist()
    torch.testing.assert_close(torch.tensor(row["teacher_topk_logprobs"]), top.values,
                               atol=1e-5, rtol=0)  # fmt: skip


def test_opd_compares_student_and_teacher_at_the_temperature_sampled(world):
    """Sampled at temperature 0.7, the teacher's top-4 log-probs in the round are its
    distribution at 0.7, and the first step's loss is the forward KL of the student's and
    the teacher's distributions at 0.7 (worked out here from the two models), not at 1."""
    metrics = run(world, "tempered", steps=1, temperature=0.7)
    (rows,) = rounds(world, "tempered")
    assert_teacher_topk(world, rows[0], 0.7)
    expected = tempered_forward_kl(world, rows, 0.7)
    assert metrics[0]["loss"] == pytest.approx(expected, rel=1e-4)
    assert abs(tempered_forward_kl(world, rows, 1.0) - expected) > 1e-3 * expected
    # pg_reverse_kl reads the sampled token's log-prob O(y): the generator records it under
    # the distribution sampled from (0.7), so on-policy the ratio to the trainer's is 1
    cfg = config(world, "tempered-pg", steps=1, temperature=0.7)
    cfg["objective"] = {"name": "opd", "loss": "pg_reverse_kl",
                        "teacher": {"path": str(world / "teacher")}}  # fmt: skip
    train(TrainConfig.model_validate(cfg))
    (rows,) = rounds(world, "tempered-pg")
    row = rows[0]
    logps = completion_logps(world, "student", row, 0.7)
    sampled = logps.gather(-1, torch.tensor(row["completion_token_ids"])[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor(row["completion_logprobs"]), sampled,
                               atol=1e-5, rtol=0)  # fmt: skip
    (step,) = read_metrics(world / "runs" / "tempered-pg")
    assert step["ratio"] == pytest.approx(1.0, abs=1e-5)


def test_opd_on_greedy_samples_compares_the_models_at_temperature_1(world):
    """Greedy decoding (temperature 0) draws from no distribution: its samples are the mode
    of the model's own, so the teacher scores them at temperature 1 and the first step's
    loss is the forward KL of the two models at 1; a loss that needs the sampling
    distribution (pg_reverse_kl) refuses greedy at start."""
    from pt_core.errors import ConfigError

    metrics = run(world, "greedy", steps=1, temperature=0.0)
    (rows,) = rounds(world, "greedy")
    assert_teacher_topk(world, rows[0], 1.0)
    assert metrics[0]["loss"] == pytest.approx(tempered_forward_kl(world, rows, 1.0), rel=1e-4)
    cfg = config(world, "greedy-pg", steps=1, temperature=0.0)
    cfg["objective"] = {"name": "opd", "loss": "pg_reverse_kl",
                        "teacher": {"path": str(world / "teacher")}}  # fmt: skip
    with pytest.raises(ConfigError, match=r"rollout.temperature=0 is greedy"):
        train(TrainConfig.model_validate(cfg))
    assert not (world / "runs" / "greedy-pg").exists()


def test_a_generator_process_gives_the_in_process_generators_run(world):
    """The same sync run with the HF engine in a generator process that is pushed the
    weights every round: the same samples, losses and final weights as generating in-process
    (per-sample seeds make sampling independent of where it runs). The generator starts on
    the starting weights, so the push and its load in the generator take time from round 1
    on; the in-process generator has no load to time."""
    local = run(world, "local", steps=3)
    server = run(world, "server", steps=3, generator="server")
    assert [m["loss"] for m in server] == pytest.approx([m["loss"] for m in local], abs=1e-6)
    assert [m["weight_push_s"] > 0 for m in server] == [False, True, True]
    assert [m["weight_load_s"] > 0 for m in server] == [False, True, True]
    assert all(m["weight_push_s"] == 0 and "weight_load_s" not in m for m in local)
    a, b = weights(world, "local", 3), weights(world, "server", 3)
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    assert [r[0]["completion_token_ids"] for r in rounds(world, "local")] == [
        r[0]["completion_token_ids"] for r in rounds(world, "server")
    ]


def test_step_off_staleness_is_n_times_updates_per_round_in_steady_state(world):
    """step_off 1 with 2 updates per round: round r+1 is asked for when round r starts, so
    from round 1 on every sample is exactly 1 x 2 updates old; round 0 is fresh."""
    metrics = run(
        world, "step-off", steps=8, generator="server", schedule="step_off", step_off=1,
        updates_per_round=2,
    )  # fmt: skip
    by_round = {}
    for m in metrics:
        by_round.setdefault(m["round"], []).append((m["staleness_min"], m["staleness_max"]))
    assert by_round[0] == [(0, 0), (0, 0)]
    for r in (1, 2, 3):
        assert by_round[r] == [(2, 2), (2, 2)]
    # the loss logged against staleness: round 0's on fresh samples, the others' on stale
    for m in metrics:
        fresh, stale = (m["loss"], None) if m["round"] == 0 else (None, m["loss"])
        assert m["loss_fresh"] == pytest.approx(fresh) and m["loss_stale"] == pytest.approx(stale)
    made = rounds(world, "step-off")
    assert [r[0]["weight_version"] for r in made] == [0, 0, 2, 4]


def test_async_never_trains_on_samples_older_than_the_bound(world):
    metrics = run(
        world, "async", steps=6, generator="server", schedule="async", max_staleness=1,
    )  # fmt: skip
    assert max(m["staleness_max"] for m in metrics) <= 1
    assert all(m["staleness_min"] >= 0 for m in metrics)


def interrupted_and_resumed(
    world: Path, name: str, steps: int, on_stop: Callable[[int], None] | None = None, **rollout
) -> list[dict]:
    """``pt-train run`` of ``name`` stopped by SIGTERM once 3 steps are logged (it exits
    85 with a full checkpoint after step 3 or 4), ``on_stop`` called with that step, then
    run again to the end; the resumed run's metrics."""
    path = world / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config(world, name, steps=steps, **rollout)))
    bindir = os.path.dirname(sys.executable)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    metrics = world / "runs" / name / "metrics.jsonl"
    proc = subprocess.Popen(
        [os.path.join(bindir, "pt-train"), "run", str(path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    while proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            proc.send_signal(signal.SIGTERM)
            break
        time.sleep(0.01)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == REQUEUE_EXIT_CODE, err
    stopped = int((world / "runs" / name / "checkpoints" / "latest").read_text()[5:])
    assert 3 <= stopped < steps
    if on_stop is not None:
        on_stop(stopped)
    done = subprocess.run(
        [os.path.join(bindir, "pt-train"), "run", str(path)],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return read_metrics(world / "runs" / name)


def test_sigterm_mid_round_then_resume_ends_with_the_uninterrupted_weights(world):
    """Two updates per round; SIGTERM after the first step of round 1 checkpoints mid-round.
    The resumed run reads round 1 from the run directory and ends bit-identical."""
    steps = 6
    reference = run(world, "resume-reference", steps=steps, updates_per_round=2)
    resumed = interrupted_and_resumed(world, "resume", steps, updates_per_round=2)
    assert [m["loss"] for m in resumed] == [m["loss"] for m in reference]
    a, b = weights(world, "resume-reference", steps), weights(world, "resume", steps)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    "schedule",
    [
        {"schedule": "step_off", "step_off": 1},
        {"schedule": "async", "max_staleness": 2, "stale": "keep"},
    ],
    ids=["step_off", "async"],
)
def test_sigterm_mid_round_then_resume_ends_with_the_uninterrupted_weights_when_overlapped(
    world, schedule
):
    """A generator process that samples ahead (step_off 1; async within 2 updates):
    SIGTERM after step 3 (mid-round, or at the next round's start: either way with a round
    in flight). The checkpoint waits for the rounds in flight and writes them, so the
    resumed run trains on the samples drawn with the weights of when they were asked for,
    and asks for later rounds at the points an uninterrupted run does: losses, staleness
    and final weights equal the uninterrupted run's."""
    steps = 8
    overlapped = {"generator": "server", "updates_per_round": 2, **schedule}
    name = f"resume-{schedule['schedule']}"
    reference = run(world, f"{name}-reference", steps=steps, **overlapped)
    resumed = interrupted_and_resumed(world, name, steps, **overlapped)
    assert [m["loss"] for m in resumed] == [m["loss"] for m in reference]
    assert [m["staleness_max"] for m in resumed] == [m["staleness_max"] for m in reference]
    a, b = weights(world, f"{name}-reference", steps), weights(world, name, steps)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.vllm
def test_in_flight_async_records_each_tokens_weights_and_resumes_on_its_rounds(world):
    """async within 2 updates, 2 updates a round, a vLLM generator process with in-flight
    updates: the weights pushed at each round start reach the rounds being generated.

    - Every sample records the version of each token, never newer than the weights its
      round trains from and never going back; its weight_version (and so its staleness) is
      its first token's; and each step's per-token metrics equal counts by hand over its
      rows.
    - Which weights sample each token depends on when the pushes land, so two
      uninterrupted runs can differ; what a resume must keep is the record. SIGTERM after
      step 3: the checkpoint waits for the rounds in flight and writes them, and the
      resumed run trains on those rounds as written (none generated again) and generates
      only the rest. A run from scratch on the resumed run's rounds gives its losses and
      final weights bit for bit."""
    require_vllm_python()
    steps, updates, rows_per_step = 8, 2, 4
    name = "in-flight"
    rollout = {
        "generator": "server", "engine": "vllm", "python": str(VLLM_PYTHON),
        "schedule": "async", "max_staleness": 2, "stale": "keep", "in_flight": True,
        "updates_per_round": updates, "max_tokens": 24,
    }  # fmt: skip
    written: dict[str, bytes] = {}
    stopped: list[int] = []

    def at_stop(step: int) -> None:
        stopped.append(step)
        for d in sorted((world / "runs" / name / "rounds").iterdir()):
            written[d.name] = (d / "rollouts.jsonl").read_bytes()

    resumed = interrupted_and_resumed(world, name, steps, on_stop=at_stop, **rollout)
    made = rounds(world, name)
    assert len(made) == steps // updates and len(resumed) == steps
    for step, m in enumerate(resumed):
        index, j = divmod(step, updates)
        rows = made[index][j * rows_per_step : (j + 1) * rows_per_step]
        tokens = []
        for row in rows:
            versions = row["token_weight_version"]
            assert len(versions) == len(row["completion_token_ids"])
            assert versions == sorted(versions) and versions[-1] <= index * updates
            assert row["weight_version"] == versions[0]
            tokens += [index * updates - v for v in versions]
        assert m["token_staleness_mean"] == pytest.approx(sum(tokens) / len(tokens))
        assert m["token_staleness_max"] == max(tokens)
        first = index * updates - min(row["weight_version"] for row in rows)
        assert m["staleness_max"] == first <= 2
        spanning = [len(set(row["token_weight_version"])) > 1 for row in rows]
        assert m["samples_spanning_versions"] == pytest.approx(sum(spanning) / len(rows))

    assert sorted(written) == [f"round-{i:06d}" for i in range(len(written))]
    # the round of the step after the checkpoint, at least, was written before it
    assert len(written) >= stopped[0] // updates + 1
    for round_name, data in written.items():
        rollouts = world / "runs" / name / "rounds" / round_name / "rollouts.jsonl"
        assert rollouts.read_bytes() == data, round_name

    replay = world / "runs" / "in-flight-replay"
    shutil.copytree(world / "runs" / name / "rounds", replay / "rounds")
    replayed = run(world, "in-flight-replay", steps=steps, updates_per_round=updates)
    for key in ("loss", "token_staleness_mean", "samples_spanning_versions"):
        assert [m[key] for m in replayed] == [m[key] for m in resumed], key
    a, b = weights(world, "in-flight-replay", steps), weights(world, name, steps)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"objective": {"name": "dpo"}}, "trains on fixed data"),
        ({"training": {"max_steps": 3}, "rollout": {"updates_per_round": 2}}, "whole number"),
        ({"training": {"global_batch_size": 3}}, "samples_per_prompt"),
        ({"rollout": {"schedule": "step_off"}}, "generator=server"),
        ({"rollout": {"engine": "vllm"}}, "generator=server"),
        ({"rollout": {"in_flight": True}}, "rollout.in_flight"),
        (
            {"rollout": {"in_flight": True, "schedule": "async", "generator": "server"}},
            "engine=hf",
        ),
    ],
)
def test_online_configs_that_cannot_work_are_refused(world, pt_train_in_process, changes, message):
    cfg = config(world, "bad")
    for section, values in changes.items():
        cfg[section] = {**cfg[section], **values} if section != "objective" else values
    if cfg["training"]["global_batch_size"] == 3:
        cfg["training"]["micro_batch_size"] = 1
    path = world / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    code, _, err = pt_train_in_process("run", path)
    assert code == 2, err
    assert message in " ".join(err.split())
    assert "Traceback" not in err


def require_vllm_python() -> None:
    if not VLLM_PYTHON.exists():
        if os.environ.get("PT_REQUIRE_VLLM"):
            pytest.fail(f"{VLLM_PYTHON} missing; run .ci/setup-vllm.sh")
        pytest.skip(f"{VLLM_PYTHON} missing; run .ci/setup-vllm.sh")


@pytest.mark.vllm
def test_vllm_generator_takes_weights_between_generations_and_within_one(
    world, mixed_cache_logprobs
):
    """A vLLM generator process with in-flight updates, started on the student:

    - pushed the teacher's weights between two generations, its greedy completions are the
      HF engine's on the teacher (before: on the student);
    - pushed the student's weights while a generation runs, the push is answered before the
      generation ends, and each completion's tokens are the teacher's first, then the
      student's. Each token's log-prob equals the HF models' given the same tokens, where the
      KV cache of the tokens before the switch is the teacher's and the student computes the
      rest (vLLM keeps the running requests' cache), and each token is that distribution's
      argmax (greedy)."""
    require_vllm_python()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pt_rollout.engines import Request, SamplingParams
    from pt_rollout.engines.hf import HFEngine
    from pt_rollout.serve import GeneratorSpec, RemoteGenerator

    tokenizer = AutoTokenizer.from_pretrained(world / "student")
    requests = [Request(tokenizer(f"What is {i} + {i}?")["input_ids"], 0) for i in range(4)]
    params = {"temperature": 0.0, "max_tokens": 12}
    long = {**params, "max_tokens": 40, "logprobs": True}
    spec = GeneratorSpec(model=str(world / "student"), engine="vllm", in_flight=True)
    with RemoteGenerator.start(spec, python=str(VLLM_PYTHON)) as gen:
        before = gen.wait(gen.submit_generate(requests, params))
        pushed = gen.wait(gen.submit_load_weights(str(world / "teacher"), version=7))
        after = gen.wait(gen.submit_generate(requests, params))
        running = gen.submit_generate(requests, long)
        push = gen.submit_load_weights(str(world / "student"), version=9)
        within = gen.wait(running)
        assert gen.done(push), "the push waited for the generation to end"
        assert gen.wait(push)["version"] == 9
    assert pushed["version"] == after["version"] == 7
    for name, version, result in (("student", 0, before), ("teacher", 7, after)):
        hf = HFEngine(str(world / name)).generate(requests, SamplingParams(**params))
        assert [c["token_ids"] for c in result["completions"]] == [c.token_ids for c in hf], name
        for c in result["completions"]:
            assert c["token_versions"] == [version] * len(c["token_ids"])
    assert within["version"] == 7
    models = {v: AutoModelForCausalLM.from_pretrained(world / name).eval()
              for v, name in ((7, "teacher"), (9, "student"))}  # fmt: skip
    for request, c in zip(requests, within["completions"], strict=True):
        versions = c["token_versions"]
        assert len(versions) == len(c["token_ids"]) > 1
        switch = versions.index(9)  # the teacher's tokens, then the student's
        assert switch > 0 and set(versions[:switch]) == {7} and set(versions[switch:]) == {9}
        logps = mixed_cache_logprobs(models[7], models[9], request.prompt_token_ids,
                                     c["token_ids"], switch)  # fmt: skip
        sampled = logps.gather(1, torch.tensor(c["token_ids"])[:, None])[:, 0]
        assert torch.allclose(sampled, torch.tensor(c["logprobs"]), atol=1e-4, rtol=0)
        assert torch.all(sampled >= logps.max(-1).values - 1e-5)  # greedy: each the argmax


@pytest.mark.vllm
def test_a_vllm_teacher_in_the_generator_process_scores_what_the_in_process_one_does(world):
    """OPD's teacher served beside a vLLM generator (both vLLM engines in one process of the
    side environment): its top-k and sampled-token log-probs of the student's completions
    equal those of the teacher loaded in this process (HF engine) to 1e-4, so the tail mass
    the loss derives from them (1 - the top-k's mass) agrees too."""
    require_vllm_python()
    from transformers import AutoTokenizer

    from pt_rollout.engines import Request
    from pt_rollout.engines.hf import HFEngine
    from pt_rollout.serve import GeneratorSpec, RemoteGenerator

    tokenizer = AutoTokenizer.from_pretrained(world / "student")
    requests = [Request(tokenizer(f"What is {i} + {i}?")["input_ids"], i) for i in range(4)]
    params = {"temperature": 1.0, "max_tokens": 12}
    spec = GeneratorSpec(
        model=str(world / "student"), engine="vllm", teacher=str(world / "teacher")
    )
    with RemoteGenerator.start(spec, python=str(VLLM_PYTHON)) as gen:
        served = gen.wait(gen.submit_generate(requests, params, {"top_k": 4}))
    completions = [c["token_ids"] for c in served["completions"]]
    assert sum(map(len, completions)) > 20
    local = HFEngine(str(world / "teacher")).score(
        [r.prompt_token_ids for r in requests], completions, top_k=4
    )
    for remote, mine in zip(served["scores"], local, strict=True):
        assert remote["topk_ids"] == mine.topk_ids
        for key in ("token_logprobs", "topk_logprobs"):
            got, want = torch.tensor(remote[key]), torch.tensor(getattr(mine, key))
            assert torch.allclose(got, want, atol=1e-4, rtol=0), (key, (got - want).abs().max())
        tail = 1 - torch.tensor(remote["topk_logprobs"]).exp().sum(-1)
        want_tail = 1 - torch.tensor(mine.topk_logprobs).exp().sum(-1)
        assert torch.allclose(tail, want_tail, atol=1e-4, rtol=0)


def test_a_teacher_with_another_tokenizer_is_refused(world, tmp_path, cli):
    """The teacher scores the student's token ids: with another vocabulary they would mean
    other text, so the run stops before training, naming the teacher."""
    from pt_data.tokenizer import build_tokenizer
    from pt_train.model import build_llama

    other = build_tokenizer(tmp_path / "other", texts=["a completely different corpus"] * 50)
    build_llama(other, hidden_size=128, num_layers=2, num_heads=2).save_pretrained(
        tmp_path / "other"
    )
    cfg = config(world, "other-teacher")
    cfg["objective"]["teacher"]["path"] = str(tmp_path / "other")
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = cli("pt-train", "run", path, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "another tokenizer than the policy" in " ".join(proc.stderr.split())
    assert not (world / "runs" / "other-teacher" / "rounds").exists()
