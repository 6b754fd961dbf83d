"""``pt-data pairs``: preference pairs from graded rollouts, for on-policy DPO.

    pt-rollout generate ... | pt-eval grade - | pt-data pairs - | pt-train run dpo.yaml --data -

Input: one row per sample (``pt-eval grade`` output of ``pt-rollout generate``): ``id``,
``sample``, ``prompt``, ``completion``, ``prompt_token_ids``, ``completion_token_ids``,
``correct``, ``grade_status``. Samples are grouped by ``id`` (one prompt) and paired:

* ``one``: one pair per prompt, a correct sample against an incorrect one, both picked
  by a generator seeded with ``(seed, id)``, so the choice does not depend on row order;
* ``all``: every (correct, incorrect) combination, at most ``k`` per prompt (a seeded
  sample of them when there are more);
* ``margin``: by a numeric column (``score_key``): every two samples whose scores differ
  by more than zero and at least ``margin``, the higher one chosen; at most ``k`` per prompt.

Samples graded ``timeout`` or ``error`` are left out and counted (``excluded``); a
``no_answer`` sample is incorrect. A prompt with only correct or only incorrect samples
gives no pair and is counted. The pair's tokens are the rollout's own:
``prompt_input_ids`` = ``prompt_token_ids``, ``chosen_input_ids`` = the chosen sample's
``completion_token_ids``, every completion token trained, so DPO trains on exactly the
tokens the model sampled. The text columns ``prompt``, ``chosen``, ``rejected`` are kept
for ``pt-data inspect``.
"""

from __future__ import annotations

import itertools
import json
import random
from collections import Counter
from dataclasses import dataclass
from numbers import Real
from pathlib import Path
from typing import Any

from pt_core.contracts import GRADE_STATUSES, TOKENIZED_PREFERENCE_COLUMNS
from pt_core.errors import InputError
from pt_core.files import atomic_path, atomic_write_json, iter_rows
from pt_core.log import get_logger, progress
from pt_data import __version__

log = get_logger(__name__)

STRATEGIES = ("one", "all", "margin")
GRADED = ("ok", "no_answer")  # statuses whose `correct` is a verdict
NEEDED = ("id", "sample", "prompt", "completion", "prompt_token_ids", "completion_token_ids")


@dataclass(frozen=True)
class PairOptions:
    strategy: str = "one"
    k: int | None = None  # most pairs per prompt (all, margin); None: no limit
    seed: int = 0
    score_key: str | None = None  # numeric column: the margin strategy's score
    margin: float | None = None  # margin strategy: least score difference

    def check(self) -> None:
        if self.strategy not in STRATEGIES:
            raise InputError(
                f"--strategy {self.strategy!r}: strategies are {', '.join(STRATEGIES)}",
            )
        if self.k is not None and self.k < 1:
            raise InputError(f"--k {self.k}: at least 1 pair per prompt")
        if self.strategy == "one" and self.k is not None:
            raise InputError(
                "--k applies to the all and margin strategies; 'one' makes one pair per prompt",
                hint="drop --k, or pass --strategy all",
            )
        if self.strategy == "margin":
            if self.score_key is None:
                raise InputError(
                    "--strategy margin needs --score-key, the numeric column to compare",
                    hint="e.g. --score-key reward",
                )
            if self.margin is not None and self.margin < 0:
                raise InputError(f"--margin {self.margin}: a margin is at least 0")
        elif self.margin is not None:
            raise InputError(
                "--margin applies to --strategy margin",
                hint="pass --strategy margin --score-key COLUMN, or drop --margin",
            )


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _sample_order(row: dict) -> tuple:
    sample = row["sample"]  # numbers in numeric order, anything else after them by its JSON
    return (0, sample, "") if isinstance(sample, int | float) else (1, 0, _key(sample))


def _score(row: dict, key: str, where: str) -> float:
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, Real):
        raise InputError(
            f"{where}: {key!r} is {value!r}; the margin strategy needs a number in every row",
            hint="name a numeric column with --score-key",
        )
    return float(value)


def _candidate_pairs(samples: list[dict], options: PairOptions, scores: dict[int, float]):
    """(chosen, rejected) candidates of one prompt's samples, in a fixed order."""
    if options.strategy == "margin":
        least = options.margin or 0.0
        return [
            (a, b)
            for a, b in itertools.permutations(samples, 2)
            if scores[id(a)] > scores[id(b)] and scores[id(a)] - scores[id(b)] >= least
        ]
    correct = [s for s in samples if s["correct"]]
    wrong = [s for s in samples if not s["correct"]]
    return [(c, w) for c in correct for w in wrong]


def make_pairs(
    rows: list[dict], options: PairOptions, *, source: str = "<rows>"
) -> tuple[list[dict], dict[str, Any]]:
    """Pairs of graded samples, per prompt id, in the order prompts first appear.

    Returns ``(pairs, counts)``; counts hold ``samples``, ``prompts``, ``pairs``,
    ``prompts_without_pair`` (``only_correct``, ``only_incorrect``, for margin
    ``no_margin``; ``all_excluded`` when no sample was graded), ``excluded`` (samples, by
    grade status) and ``dropped`` (pairs: ``identical``, ``empty_completion``).
    """
    options.check()
    if not rows:
        raise InputError(f"{source}: no rows", hint="pair the output of pt-eval grade")
    needed = (*NEEDED, options.score_key if options.strategy == "margin" else "correct")
    missing = [c for c in needed if c not in rows[0]]
    if missing:
        hint = "pass rollouts graded by pt-eval grade (pt-rollout generate | pt-eval grade -)"
        if "correct" in missing:
            hint = "grade the rollouts first: pt-eval grade ROLLOUTS, then pair the grades"
        raise InputError(
            f"{source}: missing column(s) {', '.join(map(repr, missing))}; the rows have: "
            f"{', '.join(map(repr, rows[0]))}",
            hint=hint,
        )
    excluded: Counter = Counter()
    groups: dict[str, list[dict]] = {}
    seen: set[str] = set()  # every prompt id, also those whose samples were all excluded
    scores: dict[int, float] = {}
    for number, row in enumerate(rows, start=1):
        where = f"{source} row {number}"
        for column in needed:
            if column not in row:
                raise InputError(f"{where}: no column {column!r}")
        seen.add(_key(row["id"]))
        status = row.get("grade_status", "ok")
        if isinstance(status, list) or isinstance(row.get("correct"), list):
            raise InputError(
                f"{where}: 'correct' holds a list (several predictions in one row); pairs are "
                "made from one sample per row",
                hint="grade pt-rollout generate's output, which has one row per sample",
            )
        if status not in GRADED:
            if status not in GRADE_STATUSES:
                raise InputError(
                    f"{where}: grade_status {status!r}; expected one of {', '.join(GRADE_STATUSES)}"
                )
            excluded[status] += 1
            continue
        for column in ("prompt_token_ids", "completion_token_ids"):
            if not isinstance(row[column], list):
                raise InputError(
                    f"{where}: {column!r} is {type(row[column]).__name__}; expected a list of "
                    "token ids"
                )
        if options.score_key is not None:
            scores[id(row)] = _score(row, options.score_key, where)
        groups.setdefault(_key(row["id"]), []).append(row)

    pairs: list[dict] = []
    without: Counter = Counter()
    if len(seen) > len(groups):
        without["all_excluded"] = len(seen) - len(groups)
    dropped: Counter = Counter()
    with progress() as bar:
        task = bar.add_task("pairing", total=len(groups))
        for key, samples in groups.items():
            bar.advance(task)
            samples.sort(key=_sample_order)
            first = samples[0]
            for s in samples[1:]:
                if s["prompt_token_ids"] != first["prompt_token_ids"]:
                    raise InputError(
                        f"{source}: samples {first['sample']!r} and {s['sample']!r} of id "
                        f"{first['id']!r} have different prompt_token_ids",
                        hint="ids must name one prompt each; were two rollout files joined?",
                    )
            candidates = _candidate_pairs(samples, options, scores)
            if not candidates:
                if options.strategy == "margin":
                    without["no_margin"] += 1
                else:
                    without["only_correct" if samples[0]["correct"] else "only_incorrect"] += 1
                continue
            rng = random.Random(f"{options.seed}:{key}")
            if options.strategy == "one":
                correct = [s for s in samples if s["correct"]]
                wrong = [s for s in samples if not s["correct"]]
                candidates = [(rng.choice(correct), rng.choice(wrong))]
            elif options.k is not None and len(candidates) > options.k:
                picked = sorted(rng.sample(range(len(candidates)), options.k))
                candidates = [candidates[i] for i in picked]
            for chosen, rejected in candidates:
                reason = _drop_reason(chosen, rejected)
                if reason is not None:
                    dropped[reason] += 1
                    continue
                pairs.append(_pair_row(chosen, rejected, options, scores))
    counts = {
        "samples": len(rows),
        "prompts": len(seen),
        "pairs": len(pairs),
        "prompts_without_pair": dict(sorted(without.items())),
        "excluded": dict(sorted(excluded.items())),
        "dropped": dict(sorted(dropped.items())),
    }
    return pairs, counts


def _drop_reason(chosen: dict, rejected: dict) -> str | None:
    if not chosen["completion_token_ids"] or not rejected["completion_token_ids"]:
        return "empty_completion"
    if chosen["completion_token_ids"] == rejected["completion_token_ids"]:
        return "identical"
    return None


def _pair_row(chosen: dict, rejected: dict, options: PairOptions, scores) -> dict:
    row: dict[str, Any] = {"id": chosen["id"]}
    if chosen.get("source") is not None:
        row["source"] = chosen["source"]
    row.update(
        prompt=chosen["prompt"],
        chosen=chosen["completion"],
        rejected=rejected["completion"],
        chosen_sample=chosen["sample"],
        rejected_sample=rejected["sample"],
    )
    if options.score_key is not None:
        row["margin"] = scores[id(chosen)] - scores[id(rejected)]
    c_ids, r_ids = list(chosen["completion_token_ids"]), list(rejected["completion_token_ids"])
    row.update(
        prompt_input_ids=list(chosen["prompt_token_ids"]),
        chosen_input_ids=c_ids,
        chosen_labels=list(c_ids),
        rejected_input_ids=r_ids,
        rejected_labels=list(r_ids),
    )
    return row


def default_out(path: Path) -> Path:
    """``grades.jsonl`` -> ``grades.pairs`` beside it."""
    return path.with_name(path.name.removesuffix(path.suffix) + ".pairs")


def write_pairs(
    input_path: str | Path,
    out: str | Path | None,
    options: PairOptions,
    *,
    skip_bad: bool = False,
    shard_rows: int = 100_000,
) -> dict[str, Any]:
    """Read graded rollouts, make pairs, write a dataset directory atomically; return the
    manifest fields."""
    from pt_data.build import ShardWriter, rows_table

    options.check()
    source = Path(input_path)
    bad = [0]
    rows = []
    with progress() as bar:
        task = bar.add_task("reading", total=None)
        for row in iter_rows(source, skip_bad=skip_bad, bad_counter=bad):
            rows.append(row)
            bar.advance(task)
    pairs, counts = make_pairs(rows, options, source=str(source))
    if not pairs:
        raise InputError(
            f"{source}: no pairs ({counts['prompts']} prompts; without a pair: "
            f"{counts['prompts_without_pair']}; excluded samples: {counts['excluded']})",
            hint="sample more per prompt (pt-rollout generate --n), or another strategy",
        )
    target = Path(out) if out is not None else default_out(source)
    info = {
        "format": "preferences",
        "tokenized": True,
        "splits": {"train": len(pairs)},
        **counts,
        "bad_lines": bad[0],
        "strategy": options.strategy,
        "seed": options.seed,
        "k": options.k,
        "score_key": options.score_key,
        "margin": options.margin,
        "tokenizer": None,
        "token_ids": "the rollouts' own (prompt_token_ids, completion_token_ids)",
        "input": str(source.resolve()),
        "created_by": f"pt-data {__version__}",
    }
    with atomic_path(target) as tmp:
        writer = ShardWriter(tmp / "train", shard_rows)
        writer.write(rows_table(pairs, "pairs", token_columns=TOKENIZED_PREFERENCE_COLUMNS))
        writer.close()
        atomic_write_json(tmp / "dataset.json", info)
    log.info(
        "%d pairs from %d prompts (%d samples) into %s; without a pair: %s; excluded: %s",
        counts["pairs"],
        counts["prompts"],
        counts["samples"],
        target,
        counts["prompts_without_pair"] or "none",
        counts["excluded"] or "none",
    )
    manifest = {
        "path": str(target),
        "format": "preferences",
        "tokenized": True,
        "rows": len(pairs),
        "splits": {"train": len(pairs)},
        "pairs": len(pairs),
        "prompts": counts["prompts"],
        "prompts_without_pair": counts["prompts_without_pair"],
        "excluded": counts["excluded"],
        "dropped": counts["dropped"],
        "bad_lines": bad[0],
        "strategy": options.strategy,
    }
    return manifest
