"""Reasoning Arena: a group whose rollouts all score the same carries no GRPO signal,
so its rollouts are judged against a small anchor pool and a Bradley-Terry fit gives relative rewards."""
from __future__ import annotations

from typing import Any, Sequence

import torch

from upslope.bounds import NonNegative
from upslope.registry import REWARDS
from upslope.rewards.extract import extract_integer


def fit_bradley_terry(wins: torch.Tensor, l2: float = 0.0, steps: int = 100) -> torch.Tensor:
    """Strengths [items] from a pairwise win matrix (wins[i, j]: fraction of i's comparisons with j that
    i won; 0 where not compared and wins[i, j] + wins[j, i] = 1 where compared), by L-BFGS on the
    Bradley-Terry negative log-likelihood (the reward model's loss) plus l2 x sum s^2 / 2, mean 0."""
    from upslope.algos.preference import bradley_terry_loss

    compared = (wins + wins.T) > 0
    s = torch.zeros(wins.shape[0], dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([s], max_iter=steps, tolerance_grad=1e-10, tolerance_change=1e-12,
                            line_search_fn="strong_wolfe")
    w = wins.double()

    def closure() -> torch.Tensor:
        opt.zero_grad()
        nll = (w * bradley_terry_loss(s[:, None] - s[None, :]))[compared].sum()
        loss = nll + l2 * (s ** 2).sum() / 2
        loss.backward()
        return loss

    opt.step(closure)
    out = s.detach()
    return out - out.mean()


def closeness_judge(a: str, b: str, answer: Any) -> float:
    """A rule judge for integer answers: 1 if `a` is closer to the answer than `b`, 0.5 on a tie, else 0
    (an unreadable answer is the farthest); the paper's judge is an LLM, which a judge reward could stand in for."""
    def dist(text: str) -> float:
        got = extract_integer(text, "first_result")
        return float("inf") if got is None else abs(got - int(answer))
    da, db = dist(a), dist(b)
    return 0.5 if da == db else float(da < db)


@REWARDS.register("arena", batched=True)
def arena_reward(completions: Sequence[str], answers: Sequence[Any], metas: Sequence[dict], *,
                 coef: NonNegative = 0.5, anchors: tuple[int, ...] = (1, 10, 100),
                 l2: NonNegative = 0.1) -> list[float]:
    """Reasoning Arena: 1 for a right answer (first_result integer), and, in a group whose rollouts are all
    right or all wrong, plus coef x (Bradley-Terry strength - the group's mean) from comparisons with anchors.

    coef: scale of the relative reward (keep below 1 so a right answer still outranks a wrong one)
    anchors: the anchor pool, as wrong answers at these distances from the reference (graded quality)
    l2: ridge on the strengths, which keeps a rollout that beats every anchor finite

    A group is the rollouts of one example_id. Each rollout is compared with each anchor (not with its
    group mates, as in the abstract), and the strengths of rollouts and anchors are fitted jointly.
    """
    base = [float(extract_integer(c, "first_result") == int(a)) if a is not None else 0.0
            for c, a in zip(completions, answers)]
    out = list(base)
    groups: dict[Any, list[int]] = {}
    for i, m in enumerate(metas):
        groups.setdefault(m.get("example_id", i), []).append(i)
    for rows in groups.values():
        if len({base[i] for i in rows}) != 1 or len(rows) < 2:
            continue
        answer = int(answers[rows[0]])
        pool = [f"{answer + d}" for d in anchors]
        n, k = len(rows), len(pool)
        wins = torch.zeros(n + k, n + k)
        for x, i in enumerate(rows):
            for y, anchor in enumerate(pool):
                wins[x, n + y] = closeness_judge(completions[i], anchor, answer)
                wins[n + y, x] = 1 - wins[x, n + y]
        strength = fit_bradley_terry(wins, l2)[:n]
        for x, i in enumerate(rows):
            out[i] = base[i] + coef * float(strength[x] - strength.mean())
    return out
