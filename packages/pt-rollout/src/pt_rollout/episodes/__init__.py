"""Multi-turn episodes: a policy's turns and an environment's answers, token in, token out.

- :mod:`.environment`: the environment a user writes (reset, step) and how it is called;
- :mod:`.template`: how the chat template's text between turns becomes ids appended after
  the policy's, never a rendering of the conversation again;
- :mod:`.runner`: episodes turn by turn with any engine, and their rollouts rows;
- :mod:`.config`: the ``environment`` section.
"""

from pt_rollout.episodes.config import EnvironmentConfig
from pt_rollout.episodes.environment import Environment, Step
from pt_rollout.episodes.runner import Episode, EpisodeRunner, episode_row
from pt_rollout.episodes.template import TurnTemplate

__all__ = [
    "Environment",
    "EnvironmentConfig",
    "Episode",
    "EpisodeRunner",
    "Step",
    "TurnTemplate",
    "episode_row",
]
