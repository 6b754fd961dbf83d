"""Summaries over graded samples: accuracy, unbiased pass@k, majority vote.

A *problem* has n samples, c of them correct.

- accuracy: the mean of ``correct`` over every sample;
- pass@k: the unbiased estimator of Chen et al. 2021 (Codex paper),
  ``1 - C(n-c, k) / C(n, k)``, averaged over problems, for k = 1, 2, 4, ... up
  to the smallest n (and that n itself); a problem with no samples at all counts as
  failed (0) and does not lower n;
- maj@n: the answer given most often (equal answers grouped by their canonical
  form, and every answer equal to the gold counted as one; a tie goes to the answer
  seen first) is right.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from math import comb


@dataclass
class Problem:
    id: object
    group: dict = field(default_factory=dict)
    correct: list[bool] = field(default_factory=list)
    keys: list[str | None] = field(default_factory=list)  # canonical answers, None if ungraded
    statuses: list[str] = field(default_factory=list)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn without replacement from n is correct."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def ks_for(n: int) -> list[int]:
    ks, k = [], 1
    while k <= n:
        ks.append(k)
        k *= 2
    if n >= 1 and ks[-1] != n:
        ks.append(n)
    return ks


def majority_correct(problem: Problem) -> bool:
    votes = Counter(k for k in problem.keys if k is not None)
    if not votes:
        return False
    first_seen = {}
    for index, key in enumerate(problem.keys):
        if key is not None:
            first_seen.setdefault(key, index)
    winner = max(votes, key=lambda key: (votes[key], -first_seen[key]))
    return problem.correct[first_seen[winner]]


def summarize(problems: list[Problem]) -> dict:
    """accuracy, pass@k, maj@n and counts for a list of problems."""
    samples = sum(len(p.correct) for p in problems)
    statuses = Counter(s for p in problems for s in p.statuses)
    summary: dict = {
        "problems": len(problems),
        "samples": samples,
        "accuracy": sum(sum(p.correct) for p in problems) / samples if samples else 0.0,
    }
    sampled = [p for p in problems if p.correct]
    n = min((len(p.correct) for p in sampled), default=0)
    if n:
        summary["n"] = n
        summary["pass@k"] = {
            str(k): sum(pass_at_k(len(p.correct), sum(p.correct), k) for p in sampled)
            / len(problems)
            for k in ks_for(n)
        }
        summary["maj@n"] = sum(majority_correct(p) for p in sampled) / len(problems)
    summary.update(
        no_samples=len(problems) - len(sampled),
        correct=sum(sum(p.correct) for p in problems),
        no_answer=statuses.get("no_answer", 0),
        timeouts=statuses.get("timeout", 0),
        errors=statuses.get("error", 0),
    )
    return summary


def summarize_groups(problems: list[Problem], group_key: str) -> dict[str, dict]:
    groups: dict[str, list[Problem]] = {}
    for problem in problems:
        groups.setdefault(str(problem.group.get(group_key)), []).append(problem)
    return {name: summarize(members) for name, members in sorted(groups.items())}
