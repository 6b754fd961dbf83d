"""User code named ``module:name`` or ``path/to/file.py:name`` (pt_core.objects): what
resolves, and one error naming the setting and the wrong part for what does not."""

from __future__ import annotations

import pytest

from pt_core.errors import ConfigError
from pt_core.objects import load_object


def test_a_module_and_a_file_resolve_to_their_objects(tmp_path, monkeypatch):
    (tmp_path / "user_tools_a.py").write_text("def add(a, b):\n    return a + b\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_object("user_tools_a:add", key="tools")(2, 3) == 5
    # the same file by its path: imported under a name of its own, once a process
    by_path = load_object(f"{tmp_path}/user_tools_a.py:add", key="tools")
    assert by_path(2, 3) == 5
    assert by_path is load_object(f"{tmp_path}/user_tools_a.py:add", key="tools")


def test_a_relative_path_is_from_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "envs").mkdir()
    (tmp_path / "envs" / "guess.py").write_text("class Guess:\n    turns = 3\n")
    monkeypatch.chdir(tmp_path)
    assert load_object("envs/guess.py:Guess", key="environment.name", what="class").turns == 3


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("add", "reward.function='add' does not name a function"),
        ("no_such_module_x:add", "importing no_such_module_x failed (ModuleNotFoundError"),
        ("missing.py:add", "reward.function: missing.py: no such file"),
        ("json:dumbs", "reward.function='json:dumbs': json has no dumbs"),
        ("json:__doc__", "reward.function='json:__doc__' is not a function"),
    ],
)
def test_a_name_that_does_not_resolve_says_which_part_is_wrong(spec, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load_object(spec, key="reward.function")


def test_a_file_that_raises_on_import_raises_again_on_the_next_load(tmp_path):
    """A file whose import failed is not kept half run: loading it again runs it again
    (and fails the same way) instead of handing out what it had defined before failing."""
    (tmp_path / "broken.py").write_text("x = 1\nraise RuntimeError('no config')\n")
    for _ in range(2):
        with pytest.raises(
            ConfigError, match=r"importing .*broken.py failed \(RuntimeError: no config\)"
        ):
            load_object(f"{tmp_path}/broken.py:x", key="reward.function")
