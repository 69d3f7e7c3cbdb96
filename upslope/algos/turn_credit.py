"""Turn credit for multi-turn rollouts: the outcome advantage plus a per-turn term from what the environment
reported after each model turn (the multi_turn rollout puts each turn's span and reward parts in the
trajectory's meta: `turn_spans`, `turn_parts`).

CTC-GRPO (Zhu et al. 2026, *EIBench: A Simulator-Based Benchmark and Turn-Credit RL for Emotion Management*):
a simulated user's state change after each turn, centred, is added to the GRPO advantage of that turn's
tokens, so the outcome reward stays the objective and the dense signal only redistributes credit among turns.
3SPO (*State-Score-Supervised Policy Optimization for LLM Agents*, 2026): step credit from state scores, the
success rates of the trajectories that passed through a state, without a value function.
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


def turn_states(meta: dict) -> list[str]:
    """The state each model turn of a trajectory starts from: the example and the message just before the turn
    (its prompt for the first turn, the environment's feedback after that), with the turn's index. A last
    turn cut by the token budget is not in the messages: it starts from the last one."""
    msgs = meta.get("messages", [])
    before = [msgs[k - 1].get("content", "") for k in range(1, len(msgs)) if msgs[k].get("role") == "assistant"]
    if len(meta.get("turn_spans", [])) > len(before) and msgs:
        before.append(msgs[-1].get("content", ""))
    return [f"{meta.get('example_id')}|{t}|{text}" for t, text in enumerate(before)]


@ADVANTAGES.register("state_score", grouped=True)
def state_score(batch: Batch, *, scale_by_std: bool = True, eps: NonNegative = 1e-6) -> Tensor:
    """3SPO-style step credit: a state's score is the mean return of the group's trajectories that passed
    through it (the state a turn starts from: the example, the turn's index and the observation before it);
    turn t's advantage is score(state after it) - score(state before it), the state after the last turn
    being the trajectory's own return. The credits of a trajectory's turns sum to its return minus its
    group's mean, so the step credit redistributes the outcome advantage over the turns; a tied group gets 0.

    scale_by_std: divide by the group's return std (as GRPO)
    eps: added to that std
    """
    if batch.rewards is None:
        raise ConfigError("advantage 'state_score' needs batch.rewards (score the batch first)")
    r = batch.rewards.to(torch.float64)
    adv = torch.zeros(batch.loss_mask.shape, dtype=torch.float32)
    for g in batch.group_ids.unique().tolist():
        rows = [i for i in range(batch.size) if int(batch.group_ids[i]) == g]
        states = {i: turn_states(batch.meta[i]) for i in rows}
        visits: dict[str, list[float]] = {}
        for i in rows:
            for s in set(states[i]):
                visits.setdefault(s, []).append(float(r[i]))
        score = {s: sum(v) / len(v) for s, v in visits.items()}
        std = float(r[rows].std()) if len(rows) > 1 else 0.0
        scale = 1.0 / (std + eps) if scale_by_std else 1.0
        for i in rows:
            spans = [(int(batch.prompt_lens[i]) + a, int(batch.prompt_lens[i]) + b)
                     for a, b in batch.meta[i].get("turn_spans", [])]
            if len(spans) != len(states[i]):
                raise ConfigError("advantage 'state_score' needs each model turn's span and the messages: use "
                                  "rollout.kind=multi_turn")
            after = [score[s] for s in states[i][1:]] + [float(r[i])]
            for (a, b), s, nxt in zip(spans, states[i], after):
                adv[i, a:b] = (nxt - score[s]) * scale
    return adv * (batch.loss_mask > 0)
