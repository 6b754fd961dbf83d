"""Runs on generator processes on other nodes (``rollout.servers: [host:port, ...]``),
started by hand with ``pt-rollout serve --listen``, here on 127.0.0.1 or on a second host
(a network namespace: serving.other_host): a run ends with the weights of one on processes
it started; keys that set up processes it would start, and a process that does not fit
the run, are refused with one line."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys

import pytest
import torch
from generator_runs import grpo_weights
from serving import Messages, listening, pool_warnings

from pt_core.config import validate
from pt_core.errors import ConfigError
from pt_rollout.serve import shape_of
from pt_train.config import TrainConfig

ROLLOUT = {"prompts": "p.jsonl", "generator": "server", "servers": ["node1:7000", "node2:7000"]}


@pytest.mark.parametrize(
    ("rollout", "message"),
    [
        ({"python": "/x/python"}, "rollout.python is a setting of the generator process"),
        ({"server_devices": [1, 2]}, "rollout.server_devices is a setting of the generator"),
        ({"gpu_memory_utilization": 0.5}, "(--gpu-memory-utilization)"),
        ({"max_model_len": 512}, "(--max-model-len)"),
        ({"decoder": "lean"}, "(--decoder)"),
        ({"engine": "vllm", "weight_transfer": "ipc"}, "those listed in rollout.servers are on"),
        ({"servers": ["node1"]}, "'node1' is not an address host:port"),
        ({"servers": ["node1:70000"]}, "'node1:70000' is not an address host:port"),
        ({"servers": ["a:1", "a:1"]}, "lists an address twice"),
        ({"servers": []}, "rollout.servers lists no address"),
        ({"servers": "node1:7000"}, "give a number of generator processes to start"),
        ({"servers": 0}, "rollout.servers=0: give a number"),
        ({"generator": "local"}, "rollout.servers is for rollout.generator=server; here"),
        ({"servers": 2, "server_key_file": "k"}, "remove rollout.server_key_file"),
    ],
)
def test_addresses_refuse_what_the_processes_there_decide(rollout, message):
    """Keys that set up a process pt-train starts mean nothing for processes already
    listening: one line naming the key and the pt-rollout serve option instead."""
    cfg = {"run_name": "x", "model": {"name_or_path": "m"}, "training": {"max_steps": 2},
           "rollout": {**ROLLOUT, **rollout}}  # fmt: skip
    with pytest.raises(ConfigError) as refused:
        validate(cfg, TrainConfig)
    assert message in " ".join(str(refused.value).split()), str(refused.value)


def test_nccl_and_a_key_file_are_taken_with_addresses():
    """Where the processes are on other nodes, nccl needs no server_devices (only vllm in
    pt-train's environment, which this one may lack), and the key file is theirs."""
    cfg = {"run_name": "x", "model": {"name_or_path": "m"}, "training": {"max_steps": 2},
           "rollout": {**ROLLOUT, "server_key_file": "/keys/serve.key"}}  # fmt: skip
    r = validate(cfg, TrainConfig).rollout
    assert r.server_count == 2 and r.server_addresses == ROLLOUT["servers"]
    assert r.server_key_file == "/keys/serve.key"
    cfg["rollout"].update(engine="vllm", weight_transfer="nccl")
    try:
        validate(cfg, TrainConfig)
    except ConfigError as refused:
        assert "has no vllm" in str(refused) and "server_devices" not in str(refused)


def test_a_process_that_does_not_fit_the_run_is_refused_naming_each_difference(
    tiny_model_dir,
):
    """What a listening process says of itself (info) against the run: its engine, how it
    takes weights, in-flight updates, its teacher and its model's shape, each named with
    the pt-rollout serve option that fixes it, in one error."""
    from transformers import AutoModelForCausalLM

    from pt_train.objectives import build_objective
    from pt_train.producers.online.generators import GeneratorContext, score_request
    from pt_train.producers.online.generators.listening import check_processes

    def check(cfg, infos, shape):
        objective = build_objective(cfg.objective)
        objective.configure(cfg)
        context = GeneratorContext(
            cfg,
            objective.needs,
            None,
            None,
            {},
            score_request(objective.needs),  # pyright: ignore[reportArgumentType]
        )
        check_processes(context, infos, shape)

    cfg = validate(
        {"run_name": "x", "model": {"name_or_path": str(tiny_model_dir)},
         "objective": {"name": "opd", "teacher": {"path": "/models/teacher", "top_k": 4}},
         "training": {"max_steps": 2}, "rollout": {**ROLLOUT}},
        TrainConfig,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    config = model.config.to_dict()
    shape = shape_of(config)
    fits = {"engine": "hf", "weight_transfer": None, "in_flight": False, "max_logprobs": 20,
            "logprobs_mode": "raw", "teacher": "/models/teacher", "model": "/m", "seed": 5,
            "teacher_engine": "vllm",
            "model_config": {"vocab_size": config["vocab_size"],
                             "hidden_size": config["hidden_size"]}}  # fmt: skip
    check(cfg, {1: fits}, shape)
    unfit = {**fits, "engine": "vllm", "weight_transfer": "gloo", "in_flight": True,
             "teacher": None, "model_config": {"vocab_size": 151936,
                                               "hidden_size": config["hidden_size"]}}  # fmt: skip
    with pytest.raises(ConfigError) as refused:
        check(cfg, {0: fits, 1: unfit}, shape)
    text = " ".join(str(refused.value).split())
    assert text.startswith("rollout.servers: the generator at node2:7000 does not fit this run: ")
    for part in ("its engine is vllm, rollout.engine is hf",
                 "its weight transfer is gloo, rollout.weight_transfer is files",
                 "its in-flight setting is on, rollout.in_flight is false",
                 "its teacher is none, objective.teacher.path is /models/teacher",
                 f"vocab_size 151936 (here {config['vocab_size']})"):  # fmt: skip
        assert part in text, text
    assert refused.value.hint == (
        "start pt-rollout serve there with --engine hf, no --weight-transfer, no --in-flight, "
        f"--teacher /models/teacher, --model {tiny_model_dir}"
    )
    # engine seeding: process i must be seeded as pt-train seeds the i-th it starts
    cfg = cfg.model_copy(
        update={"rollout": cfg.rollout.model_copy(update={"seeding": "engine", "seed": 3})}
    )
    with pytest.raises(ConfigError) as refused:
        check(cfg, {1: fits}, shape)
    assert "its engine seed is 5, rollout.seeding=engine wants rollout.seed + 1 = 4" in str(
        refused.value
    )
    assert refused.value.hint == "start pt-rollout serve there with --seed 4"
    check(cfg, {1: {**fits, "seed": 4}}, shape)
    # every process that does not fit is named, each with its own fixes
    with pytest.raises(ConfigError) as refused:
        check(cfg, {0: {**fits, "seed": 1}, 1: unfit}, shape)
    text = " ".join(str(refused.value).split())
    assert text.startswith(
        "rollout.servers: 2 of the 2 generators do not fit this run. At node1:7000: its engine "
        "seed is 1, rollout.seeding=engine wants rollout.seed + 0 = 3. At node2:7000: its "
        "engine is vllm, rollout.engine is hf; "
    ), text
    assert refused.value.hint == (
        "start pt-rollout serve at node1:7000 with --seed 3; at node2:7000 with --engine hf, "
        f"no --weight-transfer, no --in-flight, --seed 4, --teacher /models/teacher, --model "
        f"{tiny_model_dir}"
    )
    # without the policy's shape (a model built from model.init) the shape is not compared
    check(cfg, {1: {**fits, "seed": 4, "model_config": unfit["model_config"]}}, None)


@pytest.mark.slow
def test_a_grpo_run_on_processes_on_other_nodes_ends_with_started_ones_weights(
    tmp_path, tiny_model_dir, other_model_dir, key_file, second_host
):
    """GRPO, 2 steps, generated by two processes pt-train starts and by two listening ones
    started on another model, the second on another host and killed (SIGKILL) while round
    0 is rewarded: the connection's first push gives them the policy's weights, and
    round 1 goes to the first alone, so the samples and the final weights are the same
    bit for bit; the log names each process and how the weights travel, the first push's
    time is in round 0's weight_push_s (which has no other push), and round 1's
    generator_deaths is 1."""
    import re

    from pt_train.metrics import read_metrics

    started = grpo_weights(tmp_path, tiny_model_dir, "started", {"servers": 2})
    logger = logging.getLogger("pt.train.producers.online")
    said, level = Messages(logging.INFO), logger.level
    logger.addHandler(said)
    logger.setLevel(logging.INFO)
    try:
        with listening(other_model_dir, key_file, 2, hosts=[None, second_host]) as (
            procs, addresses,
        ):  # fmt: skip
            assert addresses[1].startswith(second_host.address + ":")
            (tmp_path / "kill_reward.py").write_text(
                "import os, signal\n"
                "from pathlib import Path\n"
                "from pool_even_reward import reward as even\n"
                "def reward(rows):\n"
                "    mark = Path(__file__).with_name('killed')\n"
                "    if not mark.exists():  # round 0\n"
                "        mark.write_text('')\n"
                f"        os.kill({procs[1].pid}, signal.SIGKILL)\n"
                "    return even(rows)\n"
            )
            with pool_warnings() as warnings:
                remote = grpo_weights(
                    tmp_path, tiny_model_dir, "remote",
                    {"servers": addresses, "server_key_file": str(key_file)},
                    reward="kill_reward:reward", deaths=(0, 1),
                )  # fmt: skip
            assert procs[1].wait(timeout=30) == -signal.SIGKILL
            # found closed before round 1 was split (so it owed nothing), or after
            assert len(warnings.messages) == 1, warnings.messages
            assert re.fullmatch(
                f"generator 1 of 2 at {re.escape(addresses[1])} closed its connection(; it "
                "owed no prompts: 1 still running|: re-sending its [0-9]+ prompts? to the 1 "
                "still running)",
                warnings.messages[0],
            ), warnings.messages
    finally:
        logger.removeHandler(said)
        logger.setLevel(level)
    for index in (0, 1):
        assert (
            f"generator {index} at {addresses[index]}: hf engine, pid {procs[index].pid}, "
            f"started on {other_model_dir} at weight version 0"
        ) in said.messages
    pushed = [
        float(found[1])
        for m in said.messages
        if (found := re.fullmatch(r"weights pushed to 2 generators on other nodes as "
                                  r"safetensors sent over the connection in ([0-9.]+) s "
                                  r"\(version 0\)", m))
    ]  # fmt: skip
    assert len(pushed) == 1, said.messages
    metrics = read_metrics(tmp_path / "runs" / "remote")
    # the log rounds to 0.01 s what it measures just after: the same time
    assert abs(metrics[0]["weight_push_s"] - pushed[0]) <= 0.01, metrics[0]
    assert metrics[0]["weight_push_s"] > 0
    assert started.keys() == remote.keys()
    assert all(torch.equal(started[k], remote[k]) for k in started)
    rows = [
        json.loads(line)
        for name in ("started", "remote")
        for line in (tmp_path / "runs" / name / "rounds" / "round-000001" / "rollouts.jsonl")
        .read_text()
        .splitlines()
    ]
    half = len(rows) // 2
    assert [r["completion_token_ids"] for r in rows[:half]] == [
        r["completion_token_ids"] for r in rows[half:]
    ]


@pytest.mark.slow  # a generator process and a pt-train run
def test_a_process_with_another_models_shape_stops_the_run_with_one_error(
    tmp_path, tiny_model_dir, tiny_tokenizer, key_file
):
    """pt-train run against a process serving a model of another width: exit 2, one
    error naming the address, the differing keys and the fix, before the run directory
    is written; no traceback."""
    import yaml

    from pt_train.model import build_llama

    narrow = tmp_path / "narrow"
    build_llama(tiny_tokenizer, hidden_size=64, num_layers=2, num_heads=2, seed=0).save_pretrained(
        str(narrow)
    )
    tiny_tokenizer.save_pretrained(str(narrow))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"{i} + {i}?",
                                           "answer": str(2 * i)}) + "\n" for i in range(4)))  # fmt: skip
    with listening(narrow, key_file, 1) as (_, addresses):
        cfg = {
            "run_name": "narrow", "output_dir": str(tmp_path / "runs"),
            "model": {"name_or_path": str(tiny_model_dir)},
            "objective": {"name": "grpo"},
            "rollout": {"prompts": str(prompts), "samples_per_prompt": 2, "max_tokens": 4,
                        "generator": "server", "servers": addresses,
                        "server_key_file": str(key_file)},
            "training": {"global_batch_size": 4, "micro_batch_size": 2, "max_steps": 1},
        }  # fmt: skip
        path = tmp_path / "narrow.yaml"
        path.write_text(yaml.safe_dump(cfg))
        done = subprocess.run(
            [sys.executable, "-m", "pt_train.cli", "run", str(path)],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
    said = " ".join(done.stderr.split())
    assert done.returncode == 2, done.stderr[-3000:]
    assert f"the generator at {addresses[0]} does not fit this run" in said, said[-2000:]
    assert "hidden_size 64 (here 128)" in said
    assert f"--model {tiny_model_dir}" in said
    assert "Traceback" not in done.stderr
    # checked before anything is written: no run directory is left to clean up
    assert not (tmp_path / "runs" / "narrow").exists()
