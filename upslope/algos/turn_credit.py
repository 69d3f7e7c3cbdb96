"""Turn credit for multi-turn rollouts: the outcome advantage plus a per-turn term from what the environment
reported after each model turn (the multi_turn rollout puts each turn's span and reward parts in the
trajectory's meta: `turn_spans`, `turn_parts`).

CTC-GRPO (Zhu et al. 2026, *EIBench: A Simulator-Based Benchmark and Turn-Credit RL for Emotion Management*):
a simulated user's state change after each turn, centred, is added to the GRPO advantage of that turn's
tokens, so the outcome reward stays the objective and the dense signal only redistributes credit among turns.
No `from __future__ import annotations` here: the registry validates options against real annotations.
"""
import torch
from torch import Tensor

from upslope.algos.common import broadcast_to_tokens, group_normalize
from upslope.batch import Batch
from upslope.bounds import NonNegative
from upslope.errors import ConfigError
from upslope.registry import ADVANTAGES


def turn_credits(batch: Batch, parts: list[str]) -> list[list[tuple[int, int, float]]]:
    """Each row's model turns as (first token, end token, credit) in row positions; a turn's credit is the sum
    of the named reward parts the environment returned for it (0 where it returned none)."""
    out = []
    for i, m in enumerate(batch.meta):
        if "turn_spans" not in m:
            raise ConfigError("advantage 'ctc_grpo' needs per-turn environment parts: use rollout.kind=multi_turn")
        p = int(batch.prompt_lens[i])
        out.append([(p + a, p + b, sum(float(d.get(k, 0.0)) for k in parts))
                    for (a, b), d in zip(m["turn_spans"], m["turn_parts"])])
    return out


@ADVANTAGES.register("ctc_grpo", grouped=True)
def ctc_grpo(batch: Batch, *, parts: list[str] | None = None, coef: NonNegative = 1.0,
             scale_by_std: bool = True) -> Tensor:
    """CTC-GRPO: GRPO's outcome advantage plus coef x (turn credit - the mean credit of every turn in the
    group) on each model turn's tokens; a turn's credit is the state change the environment reported for it.

    parts: the environment's reward parts whose per-turn values are the state change (default: progress)
    coef: weight of the centred turn credit (0: GRPO)
    scale_by_std: divide the outcome term by the group's reward std (GRPO) or only centre it
    """
    if batch.rewards is None:
        raise ConfigError("advantage 'ctc_grpo' needs batch.rewards (score the batch first)")
    outcome = group_normalize(batch.rewards.to(torch.float64), batch.group_ids, scale_by_std=scale_by_std)
    adv = broadcast_to_tokens(outcome.to(torch.float32), batch.loss_mask)
    turns = turn_credits(batch, parts or ["progress"])
    for g in batch.group_ids.unique().tolist():
        rows = [i for i in range(batch.size) if int(batch.group_ids[i]) == g]
        credits = [c for i in rows for _, _, c in turns[i]]
        if not credits:
            continue
        mean = sum(credits) / len(credits)
        for i in rows:
            for a, b, c in turns[i]:
                adv[i, a:b] += coef * (c - mean)
    return adv * (batch.loss_mask > 0)
