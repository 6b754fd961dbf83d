"""A model or tokenizer name that is not a local directory is checked before loading: a
path that is not there, or a hub name that neither the hub (offline, or out of reach)
nor the local cache can serve, is one error at once, not ~50 s of retries."""

from __future__ import annotations

import socket
import time

import pytest

from pt_core import hub
from pt_core.errors import ConfigError, InputError


@pytest.fixture
def empty_cache(monkeypatch, tmp_path):
    """An empty Hugging Face cache; the hub check asked afresh (it is asked once a process)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    for name in (*hub.OFFLINE_VARIABLES, *hub.PROXY_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    asked = hub.hub_unreachable  # the cached function, before a test replaces it
    asked.cache_clear()
    yield tmp_path / "hub"
    asked.cache_clear()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_hub_names_and_paths():
    assert hub.looks_like_hub_name("Qwen/Qwen2.5-0.5B") and hub.looks_like_hub_name("gpt2")
    # a path's marks: a leading ./ or /, more than one slash, '..'
    for path in ("./models/qwen", "/data/models/qwen", "runs/sft/inference", "../qwen"):
        assert not hub.looks_like_hub_name(path), path


@pytest.mark.parametrize(
    ("variables", "expected"),
    [
        ({"HF_HUB_OFFLINE": "1"}, "HF_HUB_OFFLINE"),
        ({"TRANSFORMERS_OFFLINE": "yes"}, "TRANSFORMERS_OFFLINE"),
        ({"HF_HUB_OFFLINE": "0"}, None),  # huggingface_hub reads "0" as false
        ({}, None),
    ],
)
def test_offline_by_either_variable(monkeypatch, variables, expected):
    for name in hub.OFFLINE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert hub.offline_variable() == expected


def test_a_local_directory_passes_without_asking_the_hub(monkeypatch, tmp_path):
    def asked():
        raise AssertionError("the hub was asked about a local directory")

    monkeypatch.setattr(hub, "hub_unreachable", asked)
    hub.require_local_or_hub(str(tmp_path), "model.name_or_path")


def test_a_missing_path_is_an_error_without_asking_the_hub(monkeypatch, tmp_path):
    monkeypatch.setattr(hub, "hub_unreachable", lambda: pytest.fail("the hub was asked"))
    with pytest.raises(ConfigError) as err:
        hub.require_local_or_hub("./models/qwen", "model.name_or_path", error=ConfigError)
    assert (
        err.value.message == "model.name_or_path './models/qwen' is not a directory (no such path)"
    )
    (tmp_path / "weights.bin").write_text("")
    with pytest.raises(InputError, match="is a file, not a directory"):
        hub.require_local_or_hub(str(tmp_path / "weights.bin"), "--model")


def test_offline_a_hub_name_must_be_in_the_cache(monkeypatch, empty_cache):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub, "hub_unreachable", lambda: pytest.fail("offline, nothing is asked"))
    with pytest.raises(InputError) as err:
        hub.require_local_or_hub("Qwen/Qwen2.5-0.5B", "data.tokenizer.name_or_path")
    assert err.value.message == (
        "data.tokenizer.name_or_path 'Qwen/Qwen2.5-0.5B' is not a directory and HF_HUB_OFFLINE "
        "is set, and it is not in the Hugging Face cache"
    )
    # once downloaded (the cache's layout: refs/main names the snapshot), it loads offline
    repo = empty_cache / "models--Qwen--Qwen2.5-0.5B"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "config.json").write_text("{}")
    hub.require_local_or_hub("Qwen/Qwen2.5-0.5B", "data.tokenizer.name_or_path")


def test_an_unreachable_hub_is_found_out_at_once_and_asked_once(monkeypatch, empty_cache):
    # nothing listens on a closed local port: the connection is refused at once
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    start = time.monotonic()
    with pytest.raises(InputError, match="the Hugging Face hub cannot be reached"):
        hub.require_local_or_hub("Qwen/Qwen2.5-0.5B", "--model")
    assert time.monotonic() - start < 2 * hub.CONNECT_TIMEOUT_S
    assert hub.hub_unreachable.cache_info().misses == 1
    with pytest.raises(InputError):
        hub.require_local_or_hub("Qwen/Qwen2.5-7B", "--model")
    assert hub.hub_unreachable.cache_info().misses == 1  # the answer is kept


def test_a_reachable_hub_lets_a_hub_name_through(monkeypatch, empty_cache):
    # a listening socket stands in for the hub: a connection opens, so the name is left to
    # transformers to fetch
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        hub.require_local_or_hub("Qwen/Qwen2.5-0.5B", "--model")
