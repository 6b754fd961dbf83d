"""A run's rounds: in memory on every rank while they are trained, written to the run
directory for resume only.

Rank 0 makes a round and hands its rows to the other ranks directly (one broadcast), and
writes ``rounds/round-NNNNNN/rollouts.jsonl`` and ``meta.json`` so that a resumed run
trains on the samples an uninterrupted run got. The log-probs of the weights a round
starts from (``old_logprobs``, for the updates after its first) are kept with the rows as
arrays, and written per rank for a run resumed mid-round.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from pt_core.files import atomic_path, atomic_write_json, iter_rows, write_rows
from pt_train.distributed import DistEnv


class RoundStore:
    def __init__(self, run_dir: Path, env: DistEnv):
        self.run_dir = Path(run_dir)
        self.env = env
        self.rows: dict[int, list[dict]] = {}  # the rounds being trained, on every rank
        self.meta: dict[int, dict] = {}
        self.ready: dict[int, tuple[list[dict], dict]] = {}  # rank 0: made ahead, not yet shared

    def directory(self, index: int) -> Path:
        return self.run_dir / "rounds" / f"round-{index:06d}"

    def written(self, index: int) -> bool:
        """Whether round ``index`` was made (a file every rank sees alike)."""
        return (self.directory(index) / "rollouts.jsonl").exists()

    def has(self, index: int) -> bool:
        return index in self.rows or self.written(index)

    def forget_before(self, index: int) -> None:
        for old in [k for k in self.rows if k < index]:
            self.rows.pop(old)

    def write(self, index: int, rows: list[dict], meta: dict) -> None:
        """Rank 0: the round's files, for resume; the rows stay in memory to be shared."""
        directory = self.directory(index)
        directory.mkdir(parents=True, exist_ok=True)
        write_rows(directory / "rollouts.jsonl", rows)
        atomic_write_json(directory / "meta.json", meta)
        self.ready[index] = (rows, meta)

    def take(self, index: int) -> tuple[list[dict], dict]:
        """Rank 0: the round made ahead in this process, or read back from its files (a
        resumed run)."""
        if index in self.ready:
            return self.ready.pop(index)
        directory = self.directory(index)
        rows = list(iter_rows(directory / "rollouts.jsonl"))
        return rows, json.loads((directory / "meta.json").read_text())

    def share(self, index: int, made: tuple[list[dict], dict] | None) -> list[dict]:
        """Every rank: rank 0's ``made`` (rows, meta) of round ``index``, broadcast to the
        others, kept in memory."""
        if self.env.world_size > 1:
            import torch.distributed as dist

            box = [made]
            dist.broadcast_object_list(box, src=0)
            made = box[0]
        assert made is not None  # rank 0's, broadcast
        rows, meta = made
        self.rows[index], self.meta[index] = rows, meta
        return rows

    # ------------------------------------------------------------------ old log-probs

    def old_logps_path(self, index: int) -> Path:
        return self.directory(index) / f"old-logps-rank{self.env.rank}.pt"

    def load_old_logps(self, index: int) -> list[np.ndarray] | None:
        """This rank's stored old log-probs of round ``index`` (a run resumed mid-round),
        or None. Runs of earlier versions stored them as JSON lists."""
        path = self.old_logps_path(index)
        if path.exists():
            return [t.numpy() for t in torch.load(path)]
        legacy = path.with_suffix(".json")
        if legacy.exists():
            return [np.asarray(v, dtype=np.float64) for v in json.loads(legacy.read_text())]
        return None

    def save_old_logps(self, index: int, values: list[torch.Tensor]) -> None:
        with atomic_path(self.old_logps_path(index)) as tmp:
            torch.save([v.contiguous() for v in values], tmp)


def round_figures(rows: list[dict]) -> dict:
    """A round's figures as it is trained (after dynamic sampling): the completions'
    length, and where the rows have them, the rewards, grades and advantages."""
    figures = {"completion_length": float(np.mean([len(r["completion_token_ids"]) for r in rows]))}
    if "reward" in rows[0]:
        rewards = np.array([r["reward"] for r in rows])
        figures["reward"] = float(rewards.mean())
        figures["reward_std"] = float(rewards.std())
    if "correct" in rows[0]:
        figures["accuracy"] = float(np.mean([bool(r.get("correct")) for r in rows]))
    if "advantage" in rows[0]:
        advantages = np.array([r["advantage"] for r in rows])
        figures["advantage"] = float(advantages.mean())
        figures["advantage_abs"] = float(np.abs(advantages).mean())
    if "group_all_equal" in rows[0]:
        equal = {r["group"]: r["group_all_equal"] for r in rows}
        figures["groups_all_equal"] = float(np.mean(list(equal.values())))
    if "completion_mask" in rows[0]:  # episodes: the means of a round's
        figures["turns"] = float(np.mean([r["num_turns"] for r in rows]))
        figures["episode_tokens"] = float(np.mean([len(r["completion_mask"]) for r in rows]))
        figures["policy_tokens"] = float(np.mean([sum(r["completion_mask"]) for r in rows]))
        figures["env_reward"] = float(np.mean([r["env_reward"] for r in rows]))
        for name in ("tool_calls", "tool_errors", "parse_failures"):
            if any(name in r for r in rows):
                figures[name] = float(np.mean([r.get(name, 0) for r in rows]))
    return figures


def per_completion_token(trained: np.ndarray, mask: list[int] | None) -> np.ndarray:
    """Values of a row's trained tokens laid out per completion token, NaN at an
    environment's tokens (which are not trained), as every token column of a row is."""
    if mask is None:
        return trained
    out = np.full(len(mask), np.nan)
    out[np.asarray(mask, dtype=bool)] = trained
    return out
