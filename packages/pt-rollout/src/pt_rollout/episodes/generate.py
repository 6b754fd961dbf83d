"""``pt-rollout generate --env``: each (prompt row, sample) an episode of an environment,
played turn by turn with the engine generate loads, written as rollouts rows with their
masks (:func:`~pt_rollout.episodes.runner.episode_row`)."""

from __future__ import annotations

from pathlib import Path

from pt_core.errors import ConfigError
from pt_rollout.episodes.config import EnvironmentConfig
from pt_rollout.episodes.environment import open_environment
from pt_rollout.episodes.runner import EpisodeRunner, episode_row
from pt_rollout.episodes.template import TurnTemplate


def environment_config(
    spec: str, *, max_turns: int | None = None, max_tokens: int | None = None
) -> EnvironmentConfig:
    """``--env``'s environment: ``module:Class``, ``file.py:Class``, or a YAML file holding
    the section (at its top or under ``environment:``); ``--max-turns`` and
    ``--max-episode-tokens`` over the section's."""
    from pt_core.config import load_config

    if spec.endswith((".yaml", ".yml")):
        import yaml

        path = Path(spec)
        if not path.is_file():
            raise ConfigError(
                f"--env {spec}: no such file", hint="give a YAML file or module:Class"
            )
        data = yaml.safe_load(path.read_text()) or {}
        nested = isinstance(data, dict) and "environment" in data
        cfg = load_config(path if not nested else None, None, EnvironmentConfig) if not nested else (
            EnvironmentConfig.model_validate(data["environment"])
        )  # fmt: skip
        if cfg.name is None:
            raise ConfigError(
                f"--env {spec}: the section names no environment", hint="set name: module:Class"
            )
    else:
        cfg = EnvironmentConfig(name=spec)
    changes = {"max_turns": max_turns, "max_tokens": max_tokens}
    return cfg.model_copy(update={k: v for k, v in changes.items() if v is not None})


class EpisodeBatches:
    """The environment of ``--env`` and the runner of its episodes for one generate."""

    def __init__(self, tokenizer, options):
        cfg = environment_config(options.env, max_turns=options.max_turns,
                                 max_tokens=options.max_episode_tokens)  # fmt: skip
        assert cfg.name is not None  # environment_config's check
        if cfg.grade:
            raise ConfigError(
                f"--env {options.env}: environment.grade adds a training run's reward; "
                "generate writes the environment's own rewards (env_reward) only",
                hint="remove grade, and grade the rows with pt-eval grade",
            )
        self.environment = open_environment(cfg, tokenizer, key="--env")
        self.template = TurnTemplate(tokenizer, tools=self.environment.tools)
        self.template.check()
        self.runner = EpisodeRunner(self.environment, self.template, max_turns=cfg.max_turns,
                                    max_tokens=cfg.max_tokens, seed=options.seed,
                                    stop=options.stop)  # fmt: skip

    def rows(self, engine, batch, sampling) -> list[dict]:
        """The rows of the (prompt row, sample) pairs of ``batch``, their episodes played
        to the end, every open episode's turn in one engine call."""
        episodes = [self.runner.start(row, sample) for row, sample in batch]
        self.runner.run(episodes, lambda requests: (engine.generate(requests, sampling), 0))
        return [episode_row(e) for e in episodes]

    def close(self) -> None:
        self.environment.close()
