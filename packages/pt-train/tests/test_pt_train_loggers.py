"""TensorBoard, W&B and MLflow beside metrics.jsonl: a logger whose package is missing is
refused with the config, before any data is read or model loaded; W&B and MLflow get the
run's resolved config; evaluation metrics are ``eval/<name>``, the rest ``train/<name>``;
``logging.wandb_mode`` overrides a user's WANDB_MODE only when set."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
import yaml

from pt_train.config import LOGGER_PACKAGES, LoggingConfig
from pt_train.metrics import MetricsWriter, logger_tags

MISSING = [(key, package) for key, module, package in LOGGER_PACKAGES if not importlib.util.find_spec(module)]  # fmt: skip

RECORDS = [
    {"step": 1, "loss": 2.5, "lr": 1e-3},
    {"step": 2, "loss": 2.0, "lr": 1e-3, "eval_loss": 2.25, "eval/rewards_margin": 0.5},
]


def test_evaluation_metrics_are_eval_and_the_rest_train():
    assert logger_tags(RECORDS[1]) == {
        "train/loss": 2.0,
        "train/lr": 1e-3,
        "eval/loss": 2.25,
        "eval/rewards_margin": 0.5,
    }


@pytest.mark.skipif(not MISSING, reason="every logger's package is installed here")
@pytest.mark.parametrize(("key", "package"), MISSING)
def test_a_logger_without_its_package_is_refused_before_any_work_and_leaves_no_run_dir(
    tmp_path, tiny_run_config, cli, key, package
):
    """The run's data does not exist: the refusal comes first, from the config alone."""
    config = tiny_run_config(tmp_path / "runs", tmp_path / "no-such-data", {"name": "sft"})
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(config))
    for command in ("check", "run"):
        proc = cli("pt-train", command, tmp_path / "train.yaml", f"logging.{key}=true", check=False)
        err = " ".join(proc.stderr.split())
        assert proc.returncode == 2, err
        assert f"logging.{key} is on but the {package} package is not installed" in err
        assert f"fix: pip install {package}, or set logging.{key}=false" in err
        assert "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def run_dir_with_config(tmp_path) -> tuple:
    run_dir = tmp_path / "runs" / "logged"
    run_dir.mkdir(parents=True)
    config = {"run_name": "logged", "training": {"learning_rate": 0.001, "max_steps": 2}}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    return run_dir, config


def write(run_dir, logging_cfg: LoggingConfig, records=RECORDS, resume_step: int = 0) -> None:
    writer = MetricsWriter(run_dir, logging_cfg, enabled=True, resume_step=resume_step)
    for record in records:
        writer.log(record)
    writer.close()


def wandb_offline_run(run_dir) -> tuple[dict, list[dict]]:
    """The config and the logged rows of the one offline W&B run in ``run_dir``, read from
    its ``.wandb`` file: a ``:W&B`` header (7 bytes), then records in 32 KiB blocks, each
    in pieces with a 7-byte header (crc32c, length, kind: 1 whole, 2 first, 3 middle, 4
    last; a block's tail shorter than a header is padding)."""
    import struct

    from wandb.proto import wandb_internal_pb2

    (path,) = (run_dir / "wandb").glob("offline-run-*/*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, pieces = 32768, 7, []
    config, rows = {}, []
    while pos + 7 <= len(data):
        left = block - pos % block
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if left < 7 or kind == 0:
            pos += left
            continue
        pieces.append(data[pos + 7 : pos + 7 + length])
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(pieces))
            pieces = []
            if record.HasField("run"):
                config.update({u.key: json.loads(u.value_json) for u in record.run.config.update})
            elif record.HasField("config"):  # the config sent after the run record
                config.update({u.key: json.loads(u.value_json) for u in record.config.update})
            elif record.HasField("history"):
                rows.append(
                    {"/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                )
    return config, rows


@pytest.fixture
def fresh_wandb():
    """W&B reads its settings (WANDB_MODE among them) once per process, as a run of pt-train
    does once; each test starts it afresh."""
    wandb = pytest.importorskip("wandb")
    yield
    wandb.teardown()


def test_wandb_gets_the_resolved_config_and_eval_metrics_under_eval(
    tmp_path, monkeypatch, fresh_wandb
):
    import wandb

    monkeypatch.delenv("WANDB_MODE", raising=False)
    run_dir, config = run_dir_with_config(tmp_path)
    write(run_dir, LoggingConfig(wandb=True))  # unset, logging.wandb_mode is offline
    # finish() returns before W&B's service has written every record to the .wandb file
    # (on a busy machine the run record was not there yet); the file is whole once the
    # service has stopped, as it stops when pt-train's process exits.
    wandb.teardown()

    run_config, rows = wandb_offline_run(run_dir)
    assert run_config["run_name"] == "logged" and run_config["training"] == config["training"]
    logged = [{k: v for k, v in row.items() if not k.startswith("_")} for row in rows]
    assert logged == [
        {"train/loss": 2.5, "train/lr": 1e-3},
        {"train/loss": 2.0, "train/lr": 1e-3, "eval/loss": 2.25, "eval/rewards_margin": 0.5},
    ]
    assert [row["_step"] for row in rows] == [1, 2]


def test_wandb_mode_overrides_the_users_wandb_mode_only_when_set(
    tmp_path, monkeypatch, fresh_wandb
):
    import wandb

    monkeypatch.setenv("WANDB_MODE", "disabled")
    run_dir, _ = run_dir_with_config(tmp_path)
    write(run_dir, LoggingConfig(wandb=True))
    assert not list((run_dir / "wandb").glob("offline-run-*"))  # the user's choice holds
    wandb.teardown()

    write(run_dir, LoggingConfig(wandb=True, wandb_mode="offline"))
    assert len(list((run_dir / "wandb").glob("offline-run-*"))) == 1


def test_mlflow_logs_the_config_as_parameters_and_a_resumed_run_goes_on_in_the_same_run(
    tmp_path, monkeypatch
):
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for this opt-in
    from mlflow.tracking import MlflowClient

    uri = (tmp_path / "mlruns").as_uri()
    run_dir, _ = run_dir_with_config(tmp_path)
    logging_cfg = LoggingConfig(mlflow=True, mlflow_tracking_uri=uri, mlflow_experiment="tiny")
    write(run_dir, logging_cfg)
    # resumed from step 2: the same MLflow run goes on
    write(run_dir, logging_cfg, [{"step": 3, "loss": 1.5, "lr": 1e-3}], resume_step=2)

    client = MlflowClient(tracking_uri=uri)
    (experiment,) = [e for e in client.search_experiments() if e.name == "tiny"]
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_id == (run_dir / "mlflow_run_id").read_text().strip()
    assert run.info.run_name == "logged"
    assert run.data.params["training.learning_rate"] == "0.001"
    assert run.data.params["run_name"] == '"logged"'
    losses = client.get_metric_history(run.info.run_id, "train/loss")
    assert [(m.step, m.value) for m in losses] == [(1, 2.5), (2, 2.0), (3, 1.5)]
    assert [m.value for m in client.get_metric_history(run.info.run_id, "eval/loss")] == [2.25]
    assert client.get_metric_history(run.info.run_id, "train/eval_loss") == []


def test_tensorboard_writes_eval_metrics_under_eval(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, _ = run_dir_with_config(tmp_path)
    write(run_dir, LoggingConfig(tensorboard=True))
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "train/lr", "eval/loss", "eval/rewards_margin"} == tags
    assert [(e.step, e.value) for e in events.Scalars("eval/loss")] == [(2, 2.25)]


def token_rows(path, n: int = 8):
    with open(path, "w") as fh:
        for i in range(n):
            ids = [5 + (i * 7 + j) % 250 for j in range(10 + i % 4)]
            fh.write(json.dumps({"input_ids": ids, "labels": ids}) + "\n")
    return path


@pytest.fixture
def clean_logger_environment(monkeypatch):
    """No MLFLOW_* or WANDB_* variable, as on a user's machine that never set one (MLflow 3
    keeps its file store behind MLFLOW_ALLOW_FILE_STORE, and its default store, a sqlite
    database, needs the full mlflow package, not the mlflow-skinny pt-train[mlflow] pulls)."""
    for name in list(os.environ):
        if name.startswith(("MLFLOW_", "WANDB_")):
            monkeypatch.delenv(name)


def mlflow_losses(store, monkeypatch) -> list[tuple[int, float]]:
    """The train/loss history of the one run in the MLflow file store ``store``."""
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # this test reads the store
    client = MlflowClient(tracking_uri=store.as_uri())
    (experiment,) = [e for e in client.search_experiments() if e.name == "pt"]
    (run,) = client.search_runs([experiment.experiment_id])
    return [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train/loss")]


@pytest.mark.slow
@pytest.mark.parametrize("store", ["default", "file"])
def test_the_loggers_as_the_docs_show_them_run_in_a_clean_environment(
    tmp_path, tiny_run_config, cli, monkeypatch, clean_logger_environment, store
):
    """`logging: {tensorboard: true, wandb: true, mlflow: true}` with MLflow's store left
    unset (pt's default: a file store <output_dir>/mlruns) or given as a file: URI: the run
    ends and every logger holds the step's loss."""
    for module in ("tensorboard", "wandb", "mlflow"):
        pytest.importorskip(module)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = tiny_run_config(
        tmp_path / "runs", token_rows(tmp_path / "rows.jsonl"), {"name": "sft"}
    )
    config["logging"] = {"tensorboard": True, "wandb": True, "mlflow": True}
    mlruns = tmp_path / "runs" / "mlruns"
    if store == "file":
        mlruns = tmp_path / "tracking"
        config["logging"]["mlflow_tracking_uri"] = mlruns.as_uri()
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(config))
    cli("pt-train", "check", tmp_path / "train.yaml", cwd=tmp_path)
    cli("pt-train", "run", tmp_path / "train.yaml", cwd=tmp_path)

    run_dir = tmp_path / "runs" / "run"
    (record,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [
        (1, pytest.approx(record["loss"]))
    ]
    assert len(list((run_dir / "wandb").glob("offline-run-*"))) == 1
    assert mlflow_losses(mlruns, monkeypatch) == [(1, pytest.approx(record["loss"]))]
    assert not (tmp_path / "mlflow.db").exists()


@pytest.mark.skipif(
    importlib.util.find_spec("sqlalchemy") is not None,
    reason="sqlalchemy is installed: MLflow's database stores can be opened here",
)
@pytest.mark.parametrize("where", ["key", "environment"])
def test_a_database_store_mlflow_cannot_open_is_refused_by_check(
    tmp_path, tiny_run_config, pt_train_in_process, monkeypatch, clean_logger_environment, where
):
    """mlflow-skinny has no sqlalchemy, which MLflow's sqlite/postgresql/mysql stores need:
    `pt-train check` refuses such a store, saying where it was set, instead of a run that
    fails after the model loads."""
    config = tiny_run_config(tmp_path / "runs", tmp_path / "no-such-data", {"name": "sft"})
    config["logging"] = {"mlflow": True}
    uri = "sqlite:///mlflow.db"
    if where == "key":
        config["logging"]["mlflow_tracking_uri"] = uri
        named = f"logging.mlflow_tracking_uri={uri}"
    else:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        named = f"MLFLOW_TRACKING_URI={uri}"
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(config))
    code, _, err = pt_train_in_process("check", tmp_path / "train.yaml")
    err = " ".join(err.split())
    assert code == 2 and "Traceback" not in err, err
    assert f"{named} is a database store, which needs the sqlalchemy package" in err
    assert "fix: pip install mlflow (the full package), or set logging.mlflow_tracking_uri" in err
    assert not (tmp_path / "runs").exists()
