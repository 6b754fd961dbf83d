"""Generator processes listening on TCP addresses (``pt-rollout serve --listen``), as a
trainer on another node finds them: started here on 127.0.0.1, each on a free port, or
on another host (:func:`other_host`: a network namespace of this machine's, which has
its own loopback and reaches the trainer only by the address on the route to it)."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pt_rollout.serve import READY


@dataclasses.dataclass(frozen=True)
class OtherHost:
    name: str  # the network namespace
    address: str  # the host's address
    peer: str  # this host's address on the link between them


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode:
        raise OSError(f"ip {' '.join(args)}: {done.stderr.strip()}")


@contextlib.contextmanager
def other_host():
    """A second host on this machine: a network namespace with its own loopback, linked
    to this one by a veth pair on a /30 of 10.213.0.0/16 (claimed with a lock file, so
    parallel tests never share one), whose /etc/hosts maps this machine's name to
    127.0.1.1, as a Debian node's does (``ip netns exec`` mounts /etc/netns/NAME/hosts
    over it). Skipped where namespaces cannot be made (not root),
    failed instead with ``PT_REQUIRE_NETNS=1`` or ``CI=true``."""
    lock = None
    for k in random.sample(range(256), 256):
        fh = open(f"/tmp/pt-test-host-{k}.lock", "w")  # noqa: SIM115  (held until the end)
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.close()
            continue
        lock = (k, fh)
        break
    assert lock is not None, "no free test subnet"
    k, fh = lock
    name, here, there = f"pt-test-host-{k}", f"ptv{k}a", f"ptv{k}b"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)  # one a killed test left
    subprocess.run(["ip", "link", "del", here], capture_output=True)
    etc = Path("/etc/netns") / name
    try:
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(f"127.0.0.1 localhost\n127.0.1.1 {socket.gethostname()}\n")
        _ip("netns", "add", name)
        _ip("link", "add", here, "type", "veth", "peer", "name", there)
        _ip("link", "set", there, "netns", name)
        _ip("addr", "add", f"10.213.{k}.1/30", "dev", here)
        _ip("link", "set", here, "up")
        _ip("-n", name, "addr", "add", f"10.213.{k}.2/30", "dev", there)
        _ip("-n", name, "link", "set", there, "up")
        _ip("-n", name, "link", "set", "lo", "up")
    except (OSError, FileNotFoundError) as exc:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
        subprocess.run(["ip", "link", "del", here], capture_output=True)
        shutil.rmtree(etc, ignore_errors=True)
        fh.close()
        why = f"no network namespace for a second host here ({exc})"
        if os.environ.get("PT_REQUIRE_NETNS") == "1" or os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    try:
        yield OtherHost(name, f"10.213.{k}.2", f"10.213.{k}.1")
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)  # the veth with it
        subprocess.run(["ip", "link", "del", here], capture_output=True)
        shutil.rmtree(etc, ignore_errors=True)
        fh.close()


def start(
    model: Path | str,
    key_file: Path,
    *args: str,
    python: str | None = None,
    host: OtherHost | None = None,
) -> tuple[subprocess.Popen, str]:
    """``pt-rollout serve --listen 127.0.0.1:0 --model MODEL --key-file KEY ARGS`` (with
    ``python``'s pt-rollout, else this environment's), or on ``host`` at its address;
    the process and its address, once it listens."""
    command = [python or sys.executable, "-m", "pt_rollout.cli", "serve", "--listen",
               f"{host.address if host else '127.0.0.1'}:0", "--model", str(model),
               "--key-file", str(key_file), *args]  # fmt: skip
    if host is not None:  # ip execs the command in the namespace: the same pid
        command = ["ip", "netns", "exec", host.name, *command]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 600
    for line in proc.stdout:
        if line.startswith(READY):
            return proc, line.split()[1]
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise AssertionError(f"pt-rollout serve did not start: exit {proc.wait()}")


@contextlib.contextmanager
def listening(
    model: Path | str,
    key_file: Path,
    count: int,
    *args: str,
    python=None,
    hosts: list[OtherHost | None] | None = None,
):
    """``count`` generator processes listening (see :func:`start`; the ``i``-th on
    ``hosts[i]``, where given): yields ``(procs, addresses)`` and stops them after."""
    started = []
    try:
        for i in range(count):
            host = hosts[i] if hosts is not None else None
            started.append(start(model, key_file, *args, python=python, host=host))
        yield [p for p, _ in started], [a for _, a in started]
    finally:
        for proc, _ in started:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)  # one a test stopped
                proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def grpo_weights(
    tmp_path: Path,
    model_dir: Path,
    name: str,
    rollout: dict,
    *,
    reward: str = "pool_even_reward:reward",
    deaths: tuple[int, int] = (0, 0),
) -> dict:
    """The final weights of GRPO, 2 steps of 2 prompts x 4 samples at temperature 1 from
    generator processes (``rollout``: the keys that place them), rewarded by a
    completion's even token ids (``pool_even_reward:reward``, in ``tmp_path``; they differ
    within every group, so the steps train); ``deaths``: each round's generator_deaths.
    The rollout correction is off: it weighs tokens by the generator's log-probs, which
    another batch width rounds differently (about 1e-6), while the samples are the same."""
    import json
    import sys

    from safetensors.torch import load_file

    from pt_train.config import TrainConfig
    from pt_train.metrics import read_metrics
    from pt_train.trainer import train

    prompts = tmp_path / "prompts.jsonl"
    if not prompts.exists():
        with open(prompts, "w") as fh:
            for i in range(8):
                fh.write(json.dumps({"id": f"p{i}", "prompt": f"What is {i} + {i}?",
                                     "answer": str(2 * i)}) + "\n")  # fmt: skip
        (tmp_path / "pool_even_reward.py").write_text(
            "def reward(rows):\n"
            "    return [sum(t % 2 == 0 for t in r['completion_token_ids']) for r in rows]\n"
        )
    cfg = {
        "run_name": name,
        "output_dir": str(tmp_path / "runs"),
        "model": {"name_or_path": str(model_dir)},
        "objective": {"name": "grpo", "rollout_correction": {"level": "none"}},
        "reward": {"function": reward},
        "rollout": {"prompts": str(prompts), "samples_per_prompt": 4, "max_tokens": 8,
                    "temperature": 1.0, "generator": "server", **rollout},
        "training": {"seed": 0, "learning_rate": 1e-3, "lr_schedule": "constant",
                     "global_batch_size": 8, "micro_batch_size": 4, "max_steps": 2},
    }  # fmt: skip
    sys.path.insert(0, str(tmp_path))  # the reward's module
    try:
        train(TrainConfig.model_validate(cfg))
    finally:
        sys.path.remove(str(tmp_path))
    metrics = read_metrics(tmp_path / "runs" / name)
    assert [m["generator_deaths"] for m in metrics] == list(deaths)
    assert any(m["reward_std"] > 0 for m in metrics)  # a gradient to follow
    return load_file(tmp_path / "runs" / name / "inference" / "step-2" / "model.safetensors")
