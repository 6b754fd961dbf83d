"""Generator processes for the tests: the requests and answers they are checked with
(:func:`requests`, :func:`same`), and processes listening on TCP addresses (``pt-rollout
serve --listen``), as a trainer on another node finds them: started here on 127.0.0.1,
each on a free port, or on another host (:func:`other_host`: a network namespace of this
machine's, which has its own loopback and reaches the trainer only by the address on the
route to it)."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import logging
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

from pt_rollout.engines import Request
from pt_rollout.serve import READY, GeneratorPool

# Sampled (temperature 1) with per-sample seeds, so each completion is its seed's whatever
# process and batch it lands in; log-probs and the raw top-2 recorded as the loop asks.
PARAMS = {"temperature": 1.0, "max_tokens": 8, "logprobs": True, "logprobs_top_k": 2}
SCORE = {"top_k": 2, "at_student_topk": False}


def requests(tokenizer) -> list[Request]:
    """7 requests (shards of 4 and 3 over two processes) of prompts of different lengths."""
    prompts = [f"What is {i} + {i * 37}?" + " Think." * (i % 3) for i in range(7)]
    return [Request(tokenizer(p)["input_ids"], seed=100 + i) for i, p in enumerate(prompts)]


def generate(pool: GeneratorPool, reqs: list[Request]) -> dict:
    return pool.wait(pool.submit_generate(reqs, PARAMS, SCORE))


def agree(a, b) -> bool:
    """Equal token ids (and every other integer or string); log-probs equal to float
    rounding: the HF engine left-pads a batch to its longest prompt, and another width
    rounds the same sums differently (about 1e-6), whichever process runs it."""
    if isinstance(a, float) or isinstance(b, float):
        return abs(a - b) <= 1e-5
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(agree(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(agree(a[k], b[k]) for k in a)
    return a == b


def same(a: dict, b: dict) -> None:
    """Two answers agree: version, completions (token ids, log-probs, top-k) and teacher
    scores, in request order."""
    assert a["version"] == b["version"]
    assert [c["token_ids"] for c in a["completions"]] == [c["token_ids"] for c in b["completions"]]
    assert agree(a["completions"], b["completions"])
    assert agree(a["scores"], b["scores"])


class Messages(logging.Handler):
    """The messages a logger emits at ``level`` and above."""

    def __init__(self, level: int = logging.WARNING):
        super().__init__(level)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def pool_warnings():
    """The pool's warnings while the block runs."""
    logger = logging.getLogger("pt.rollout.serve")
    warnings = Messages()
    logger.addHandler(warnings)
    try:
        yield warnings
    finally:
        logger.removeHandler(warnings)


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
