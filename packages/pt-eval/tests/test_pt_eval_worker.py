"""The worker pool: every item is graded under a hard time limit in a subprocess that is
killed and replaced when it overruns; adversarial predictions come back as timeout or
error, never as a crash, a hang, or executed code."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

from pt_eval.worker import GradingPool

SLOW = "\\boxed{e^{e^{e^{e^{e}}}}}"  # e^(e^(3.8 million)): sympy's evalf never finishes


@pytest.fixture(scope="module")
def pool():
    with GradingPool(workers=2, timeout=1.5) as pool:
        yield pool


def test_adversarial_predictions(pool, tmp_path):
    marker = tmp_path / "x"
    items = [
        (f"\\boxed{{__import__('os').system('touch {marker}')}}", "1"),
        (f"\\boxed{{exec(\"open('{marker}','w')\")}}", "1"),
        ("\\boxed{9^{9^{9^{9}}}}", "1"),
        ("\\boxed{" + "{" * 10_000 + "1" + "}" * 10_000 + "}", "1"),
        ("\\boxed{" + "(" * 10_000 + "1" + ")" * 10_000 + "}", "1"),
        ("x" * 5_000_000 + " \\boxed{1+1+1}", "3"),
        ("\\boxed{" + "1+" * 2_500_000 + "1}", "3"),
        ("9" * 10_000_000, "9"),
        ("\\boxed{" + "9" * 10_000 + "}", "9"),
        (SLOW, "1"),
        ("\\boxed{2}", "2"),
    ]
    results = pool.grade(items)
    statuses = [r["status"] for r in results]
    # code-shaped answers are parsed as products of symbols, compared, and found wrong
    assert statuses[:2] == ["ok", "ok"] and not any(r["correct"] for r in results[:2])
    assert not marker.exists()
    assert statuses[2] == "error"  # a power tower is refused, not computed
    assert statuses[3] == "error" and statuses[4] == "error"  # nesting past the depth limit
    assert results[5]["status"] == "error"  # a 5 MB response is past the length limit
    assert results[6]["status"] == "error"
    assert statuses[7] == "error"  # a 10^7-digit number
    assert statuses[8] == "error"  # a 10^4-digit literal is past the literal limit
    assert statuses[9] == "timeout"
    assert results[10] == {**results[10], "status": "ok", "correct": True}


def test_an_overrunning_item_kills_its_worker_and_the_rest_go_on(pool):
    restarts = pool.restarts
    items = [(SLOW, "1"), ("\\boxed{1}", "1"), (SLOW, "2"), ("\\boxed{\\frac12}", "0.5")] * 2
    results = pool.grade(items)
    assert [r["status"] for r in results] == ["timeout", "ok"] * 4
    assert [r["correct"] for r in results] == [False, True] * 4
    # the two slow items are one answer with two golds: each is graded (and times out)
    # once for all its copies, and each timeout costs one fresh worker
    assert pool.restarts - restarts == 2


def test_grading_works_from_another_thread(pool):
    out = {}

    def work():
        out["results"] = pool.grade([(SLOW, "1"), ("\\boxed{3}", "3")])

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert [r["status"] for r in out["results"]] == ["timeout", "ok"]


def test_a_worker_that_dies_is_replaced(pool):
    pool.wait_ready()
    os.kill(pool.workers[0].pid, signal.SIGKILL)
    results = pool.grade([(f"\\boxed{{{i}}}", str(i)) for i in range(40)])
    # at most the one item sent to the dead worker is reported; every other one is graded
    assert sum(r["status"] == "error" for r in results) <= 1
    assert sum(r["correct"] for r in results) >= 39
    pool.wait_ready()
    assert len(pool.workers) == pool.size  # the dead worker was replaced


def test_results_come_back_in_input_order(pool):
    items = [(f"\\boxed{{{i}}}", str(i if i % 3 else i + 1)) for i in range(200)]
    results = pool.grade(items)
    assert [r["extracted"] for r in results] == [str(i) for i in range(200)]
    assert [r["correct"] for r in results] == [i % 3 != 0 for i in range(200)]


def _busy_file(path) -> None:
    """Rows whose answers need the full parser (sqrt k against k): the workers stay busy."""
    from pt_core.files import write_rows

    write_rows(path, [{"id": k, "completion": f"\\boxed{{\\sqrt{{{k}}}}}", "answer": str(k)}
                      for k in range(2, 4000)])  # fmt: skip


def _start_grading(tmp_path, command: list[str] | None = None):
    """``pt-eval grade`` (or ``command``, given the same arguments) on the busy file, with
    its socket directory under tmp_path; returns the process once its workers are grading."""
    import subprocess
    import sys
    import time

    _busy_file(tmp_path / "busy.jsonl")
    sockets = tmp_path / "tmp"
    sockets.mkdir()
    proc = subprocess.Popen(
        [*(command or [str(Path(sys.executable).parent / "pt-eval")]), "grade",
         str(tmp_path / "busy.jsonl"), "--workers", "2", "--timeout", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "TMPDIR": str(sockets)},
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not list(sockets.glob("pt-eval-*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(sockets.glob("pt-eval-*")), "the pool never started"
    time.sleep(1.5)  # the fork server imports sympy and the workers take items
    return proc, sockets


# pt-eval grade whose pool cannot close (as if the signal had left a lock held), with a
# 2-second grace: what a SIGTERM must still end.
STUCK_CLOSE = """
import sys, threading
from pt_eval import cli
from pt_eval.worker import GradingPool
cli.TERMINATE_GRACE = 2.0
GradingPool.close = lambda self: threading.Event().wait()
sys.argv = ["pt-eval", *sys.argv[1:]]
cli.main()
"""


def test_sigterm_ends_a_grading_that_cannot_unwind(tmp_path):
    """Should unwinding hang, the process still ends after the grace: its fork server
    and workers killed, its socket directory removed, one line, SIGTERM's exit code."""
    import subprocess
    import sys
    import time

    proc, sockets = _start_grading(tmp_path, [sys.executable, "-c", STUCK_CLOSE])
    server_pids = [int(p) for p in subprocess.run(
        ["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()]  # fmt: skip
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    assert "the grading did not unwind in time" in stderr
    assert "Traceback" not in stderr
    assert list(sockets.glob("pt-eval-*")) == []
    time.sleep(0.5)
    for pid in server_pids:  # the fork server was killed, not left behind
        assert (
            not Path(f"/proc/{pid}").exists()
            or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
        )


def test_sigterm_removes_the_socket_directory(tmp_path):
    proc, sockets = _start_grading(tmp_path)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    assert list(sockets.glob("pt-eval-*")) == []  # the pool closed and removed its socket
    assert "Traceback" not in stderr


def test_a_worker_whose_pool_goes_away_leaves_quietly(capfd):
    # the pool's end of a worker's socket closes while the worker still has results to send
    # (the grader was interrupted): the worker meets a broken pipe and must leave without
    # printing a traceback on the user's terminal
    import json
    import time

    pool = GradingPool(workers=1, timeout=30)
    try:
        pool.wait_ready()
        worker = pool.workers[0]
        items = "".join(
            json.dumps({"i": k, "x": f"\\sqrt{{{k}}}", "g": str(k), "o": {}}) + "\n"
            for k in range(2, 400)
        )
        worker.conn.setblocking(True)
        worker.conn.sendall(items.encode())
        worker.conn.close()
        time.sleep(3)  # the worker grades, writes into the closed socket, and leaves
    finally:
        pool.close()
    assert "Traceback" not in capfd.readouterr().err


# --------------------------------------------------------------------------- isolation

# module names the grader imports (stdlib, sympy): a file of that name in the folder where
# a user grades must never run; each one leaves a marker and breaks its import
HOSTILE_MODULES = ("timeit", "sympy", "re")


def _hostile_folder(folder):
    for name in HOSTILE_MODULES:
        (folder / f"{name}.py").write_text(
            f"open({str(folder / (name + '.imported'))!r}, 'w').close()\n"
            f"raise ImportError('the grader imported {name}.py from the current directory')\n"
        )
    return folder


def _markers(folder) -> list[str]:
    return sorted(p.name for p in folder.glob("*.imported"))


# \sqrt{4}/4 needs sympy, so these rows are graded in the worker, not in the caller
SYMPY_ROWS = [
    {"id": 1, "response": "so $\\boxed{\\sqrt{4}/4}$", "answer": "0.5"},
    {"id": 2, "response": "so $\\boxed{\\sqrt{8}}$", "answer": "2\\sqrt{2}"},
    {"id": 3, "response": "so $\\boxed{\\sqrt{9}}$", "answer": "4"},
]


def test_grade_cli_never_imports_modules_from_the_current_directory(cli, tmp_path):
    from pt_core.files import read_rows, write_rows

    folder = _hostile_folder(tmp_path)
    write_rows(folder / "preds.jsonl", SYMPY_ROWS)
    proc = cli("pt-eval", "grade", "preds.jsonl", "--workers", "1", cwd=folder)
    assert _markers(folder) == []
    assert "Traceback" not in proc.stderr
    # sqrt(4)/4 = 0.5 and sqrt(8) = 2 sqrt(2) are right, sqrt(9) = 3 is not 4
    assert [r["correct"] for r in read_rows(folder / "preds.grades.jsonl")] == [True, True, False]


def test_grade_file_from_python_never_imports_modules_from_the_current_directory(
    tmp_path, monkeypatch
):
    from pt_core.files import write_rows
    from pt_eval.grade import GradeOptions, grade_file

    folder = _hostile_folder(tmp_path)
    write_rows(folder / "preds.jsonl", SYMPY_ROWS)
    monkeypatch.chdir(folder)
    _, summary = grade_file("preds.jsonl", "grades.jsonl", GradeOptions(workers=1))
    assert _markers(folder) == []
    assert summary["correct"] == 2 and summary["errors"] == 0
