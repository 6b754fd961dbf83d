"""`pt-train plot`: one run's curves beside it, or several runs in one figure (a panel per
key, a line per run named after the run), and metrics.jsonl read with clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pt_core.errors import InputError
from pt_train.metrics import read_metrics
from pt_train.plot import draw_figure, load_series, plot_metrics, run_labels, running_mean

PNG = b"\x89PNG\r\n\x1a\n"


def write_run(run: Path, records: list[dict]) -> Path:
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


@pytest.fixture
def runs(tmp_path):
    """Two runs named sft in different output directories; only the first logged
    grad_norm, and its step 2 has no lr (None, as mfu is on a CPU)."""
    a = write_run(
        tmp_path / "out-a" / "sft",
        [
            {"step": 1, "loss": 3.0, "lr": 1e-3, "grad_norm": 2.0},
            {"step": 2, "loss": 2.5, "lr": None, "grad_norm": 1.5},
        ],
    )
    b = write_run(
        tmp_path / "out-b" / "sft",
        [{"step": 1, "loss": 4.0, "lr": 2e-3}, {"step": 2, "loss": 3.0, "lr": 2e-3}],
    )
    return a, b


def test_series_hold_the_numeric_points_of_each_run(runs):
    a, b = runs
    series = load_series([a, b], ("loss", "lr", "grad_norm"))
    assert series[a] == {
        "loss": [(1, 3.0), (2, 2.5)],
        "lr": [(1, 1e-3)],  # the None at step 2 is no point
        "grad_norm": [(1, 2.0), (2, 1.5)],
    }
    assert series[b] == {"loss": [(1, 4.0), (2, 3.0)], "lr": [(1, 2e-3), (2, 2e-3)]}


def test_runs_of_the_same_name_are_told_apart_by_their_parent(runs, tmp_path):
    a, b = runs
    other = write_run(tmp_path / "dft", [{"step": 1, "loss": 1.0}])
    assert run_labels([a, b, other]) == {a: "out-a/sft", b: "out-b/sft", other: "dft"}


def test_the_figure_has_a_panel_per_key_and_a_line_per_run(runs):
    a, b = runs
    keys = ["loss", "grad_norm"]
    fig = draw_figure(keys, load_series([a, b], tuple(keys)))
    loss, grad = [ax for ax in fig.axes if ax.get_visible()]
    assert loss.get_title() == "loss" and grad.get_title() == "grad_norm"
    assert [line.get_label() for line in loss.get_lines()] == ["out-a/sft", "out-b/sft"]
    assert list(loss.get_lines()[1].get_ydata()) == [4.0, 3.0]
    # run b never logged grad_norm: it has no line there, and the figure is still drawn
    assert [line.get_label() for line in grad.get_lines()] == ["out-a/sft"]


def test_smooth_draws_the_running_mean_over_a_faint_line(tmp_path):
    assert running_mean([1.0, 3.0, 2.0, 6.0], 2) == [1.0, 2.0, 2.5, 4.0]
    assert running_mean([1.0, 3.0, 2.0], 10) == [1.0, 2.0, 2.0]
    run = write_run(tmp_path / "grpo", [{"step": s, "reward": float(s % 2)} for s in range(1, 7)])
    fig = draw_figure(["reward"], load_series([run], ("reward",)), smooth=3)
    raw, mean = fig.axes[0].get_lines()
    assert raw.get_alpha() == 0.3 and mean.get_label() == "grpo, mean of 3"
    np.testing.assert_allclose(mean.get_ydata(), [1, 0.5, 2 / 3, 1 / 3, 2 / 3, 1 / 3])
    assert plot_metrics([run], keys=("reward",), smooth=3) == [run / "reward.png"]
    with pytest.raises(InputError, match="--smooth -1"):
        plot_metrics([run], keys=("reward",), smooth=-1)


def test_several_runs_go_to_one_file_and_one_run_keeps_its_pngs(runs, tmp_path):
    a, b = runs
    out = tmp_path / "compare.png"
    assert plot_metrics([a, b], out, ("loss", "grad_norm")) == [out]
    assert out.read_bytes()[:8] == PNG
    assert plot_metrics([a]) == [a / "loss.png", a / "lr.png"]
    assert all((a / name).read_bytes()[:8] == PNG for name in ("loss.png", "lr.png"))


def test_bad_input_is_named(runs, tmp_path):
    a, b = runs
    with pytest.raises(InputError, match="2 runs to compare, and no --out"):
        plot_metrics([a, b])
    with pytest.raises(InputError, match=r"no run logged 'mfu'; the runs logged: grad_norm, loss"):
        plot_metrics([a, b], tmp_path / "x.png", ("mfu",))
    with pytest.raises(InputError, match="no such directory"):
        plot_metrics([tmp_path / "nope"])
    with pytest.raises(InputError, match="no metrics.jsonl"):
        plot_metrics([tmp_path])
    with pytest.raises(InputError, match=r"cannot draw a '.xyz' file"):
        plot_metrics([a], tmp_path / "x.xyz")
    assert not (tmp_path / "x.png").exists() and not (tmp_path / "x.xyz").exists()


def test_a_malformed_metrics_line_is_named_and_a_torn_last_line_dropped(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "lo')
    # A crash mid-write leaves a last line without its newline: the steps before it stand.
    assert read_metrics(run) == [{"step": 1, "loss": 2.0}]
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\nnot json\n{"step": 3}\n')
    with pytest.raises(InputError, match=r"metrics.jsonl:2: malformed metrics line"):
        read_metrics(run)


@pytest.mark.slow
def test_the_cli_compares_runs(runs, tmp_path, cli):
    a, b = runs
    out = tmp_path / "cmp.png"
    proc = cli("pt-train", "plot", a, b, "--out", out, "--key", "loss", "--key", "grad_norm")
    assert proc.stdout == "" and out.read_bytes()[:8] == PNG
    assert "wrote" in proc.stderr and "Traceback" not in proc.stderr
