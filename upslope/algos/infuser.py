"""INFUSER's advantage: the solver's rows by GRPO within each drafted question's answers, the generator's rows by
DuGRPO on their questions' influence (the RL trainer's `influence` pass, upslope.train.learner.influence); and
its baseline, the same with the generator rewarded by a difficulty heuristic."""
from __future__ import annotations

import torch
from torch import Tensor

from upslope.algos.common import broadcast_to_tokens, group_normalize
from upslope.batch import Batch
from upslope.bounds import NonNegative
from upslope.errors import ConfigError
from upslope.registry import ADVANTAGES


def dual_normalize(scores: Tensor, group_ids: Tensor, *, invalid_penalty: float, eps: float) -> Tensor:
    """DuGRPO: influence scores z-scored over the whole batch first (their scale drifts with the optimiser's
    moments and the solver's loss, so one batch's noise sets the unit), a score that is NaN (no well-formed
    draft) set to -`invalid_penalty` in that unit, then normalised within each document's drafts as GRPO does."""
    s = scores.to(torch.float64)
    ok = ~torch.isnan(s)
    z = torch.full_like(s, -float(invalid_penalty))
    if int(ok.sum()) > 1 and float(s[ok].std()) > 0:
        z[ok] = (s[ok] - s[ok].mean()) / (s[ok].std() + eps)
    elif bool(ok.any()):
        z[ok] = 0.0
    return group_normalize(z, group_ids, eps=eps).to(torch.float64)


def two_roles(batch: Batch, draft_scores: Tensor, *, invalid_penalty: float, eps: float) -> Tensor:
    """[N, L]: drafts by DuGRPO of their scores (NaN: malformed), answers by GRPO within their own question's
    answers, target rows 0 (measured, not trained)."""
    if batch.rewards is None:
        raise ConfigError("the infuser advantages need batch.rewards (score the batch first)")
    roles = [m.get("infuser_role") for m in batch.meta]
    adv = torch.zeros(batch.size, dtype=torch.float64)
    drafts = [i for i, r in enumerate(roles) if r == "generator"]
    if drafts:
        adv[drafts] = dual_normalize(draft_scores[drafts], batch.group_ids[drafts], invalid_penalty=invalid_penalty,
                                     eps=eps)
    solver = [i for i, r in enumerate(roles) if r == "solver"]
    if solver:
        question = question_index(batch, solver)
        adv[solver] = group_normalize(batch.rewards[solver].to(torch.float64), question, eps=eps).to(torch.float64)
    return broadcast_to_tokens(adv, batch.loss_mask).float()


def question_index(batch: Batch, rows: list[int]) -> Tensor:
    """[len(rows)]: which drafted question each row answers (an index over the batch's questions)."""
    keys = sorted({batch.meta[i]["infuser_question"] for i in rows})
    return torch.tensor([keys.index(batch.meta[i]["infuser_question"]) for i in rows])


@ADVANTAGES.register("infuser", grouped=True, whole_batch=True, features="influence")
def infuser(batch: Batch, features: Tensor | None = None, *, invalid_penalty: NonNegative = 1.0,
            eps: NonNegative = 1e-6) -> Tensor:
    """INFUSER: the generator is rewarded by its question's optimizer-aware influence on the solver (DuGRPO), the
    solver by correctness against the generator's answer (GRPO over the question's answers); rollout.kind infuser.

    invalid_penalty: a draft that is not 'Question: ...? Answer: N' scores this many batch standard deviations
        below the mean before the within-document normalisation (a malformed draft teaches the solver nothing)
    eps: added to each standard deviation

    The abstract leaves DuGRPO's two normalisations open: here the batch z-score, then the group's GRPO
    normalisation (our choice).
    """
    if features is None or features.shape[0] != batch.size:
        raise ConfigError("advantage 'infuser' needs each draft's influence (the RL trainer computes it) and "
                          "rollout.kind: infuser")
    return two_roles(batch, features[:, 0], invalid_penalty=invalid_penalty, eps=eps)


@ADVANTAGES.register("infuser_difficulty", grouped=True, whole_batch=True)
def infuser_difficulty(batch: Batch, *, invalid_penalty: NonNegative = 1.0, eps: NonNegative = 1e-6) -> Tensor:
    """INFUSER's baseline: the generator rewarded by a difficulty heuristic instead of influence, 1 - |2p - 1| of
    its question's solve rate p (highest when the solver is right half the time), normalised as `infuser` does.

    invalid_penalty: as in `infuser`
    eps: added to each standard deviation
    """
    if batch.rewards is None:
        raise ConfigError("advantage 'infuser_difficulty' needs batch.rewards (score the batch first)")
    scores = torch.full((batch.size,), float("nan"), dtype=torch.float64)
    solver = [i for i, m in enumerate(batch.meta) if m.get("infuser_role") == "solver"]
    rate: dict[str, list[float]] = {}
    for i in solver:
        rate.setdefault(batch.meta[i]["infuser_question"], []).append(float(batch.rewards[i] >= 0.5))
    for i, m in enumerate(batch.meta):
        if m.get("infuser_role") == "generator" and m.get("infuser_question") in rate:
            p = sum(rate[m["infuser_question"]]) / len(rate[m["infuser_question"]])
            scores[i] = 1.0 - abs(2.0 * p - 1.0)
    return two_roles(batch, scores, invalid_penalty=invalid_penalty, eps=eps)
