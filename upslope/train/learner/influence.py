"""INFUSER's optimizer-aware influence of each drafted question on the solver (the FEATURES source `influence`
of advantage `infuser`): how much one optimiser step on the question's solver group would lower the solver's
loss on the target rows.

The step AdamW takes from a gradient g moves the weights by -lr * P g, P = 1 / (sqrt(v_hat) + eps) from its
second moments, so to first order the target loss changes by -lr * <g_T, P g_q>: the influence is
<g_T, P g_q>, positive when the question would help. g_q is the gradient of the question's policy-gradient
surrogate at ratio 1 (-sum_i A_i log pi(y_i) over its answers' trained tokens, A the group's GRPO advantage
against the drafted answer), g_T that of the target rows' mean negative log-likelihood of their reference
answers. Before the optimiser's first step it has no moments and P is 1 (plain gradients)."""
from __future__ import annotations

import math
from typing import Any

import torch

from upslope.algos.common import group_normalize
from upslope.batch import Batch
from upslope.train.learner.logprobs import token_logprobs


def completion_mask(batch: Batch) -> torch.Tensor:
    """[N, L]: 1 on each row's completion tokens (trained or not: a target row's reference answer has loss mask 0)."""
    pos = torch.arange(batch.input_ids.shape[1], device=batch.input_ids.device)[None]
    return ((pos >= batch.prompt_lens[:, None]) & (pos < batch.seq_lens[:, None])).float()


def adam_preconditioner(optimizer: torch.optim.Optimizer, p: torch.Tensor) -> torch.Tensor | None:
    """1 / (sqrt(v_hat) + eps) of parameter `p` from the optimiser's bias-corrected second moments (torch's AdamW,
    or upslope's with plain or 8-bit moments); None before its first step (no moments yet)."""
    state = optimizer.state.get(p, {})
    if "exp_avg_sq" not in state:
        return None
    group = next(g for g in optimizer.param_groups if any(q is p for q in g["params"]))
    v = state["exp_avg_sq"]
    if "exp_avg_sq_scale" in state:  # 8-bit codes of sqrt(v), whole blocks
        from upslope.train.learner.adamw import dequantize_log8

        v = dequantize_log8(v, state["exp_avg_sq_scale"]).square()[:p.numel()].view_as(p)
    step = float(state["step"])
    v_hat = v.float() / (1 - group["betas"][1] ** step)
    return 1.0 / (v_hat.sqrt() + group["eps"])


def _gradients(model: Any, params: list[torch.Tensor], loss: torch.Tensor) -> list[torch.Tensor]:
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return [torch.zeros_like(p, dtype=torch.float32) if g is None else g.float() for p, g in zip(params, grads)]


def influence(updater: Any, batch: Batch) -> torch.Tensor:
    """[N, 1]: each generator row's influence <g_T, P g_q> of its drafted question (NaN for a generator row
    without a well-formed draft, 0 for a question whose answers all scored alike: no step, no influence, and
    0 on solver and target rows). Reads meta["infuser_role"] and meta["infuser_question"] (rollout `infuser`)."""
    out = torch.zeros(batch.size, 1)  # cpu: features are gathered on the host, as rollout_features returns them
    roles = [m.get("infuser_role") for m in batch.meta]
    target = [i for i, r in enumerate(roles) if r == "target"]
    drafts = [i for i, r in enumerate(roles) if r == "generator"]
    if not drafts:
        return out
    model = updater.model
    params = [p for p in model.parameters() if p.requires_grad]
    for i in drafts:
        out[i, 0] = math.nan if batch.meta[i].get("infuser_question") is None else 0.0
    if not target or batch.rewards is None:
        return out
    with updater.autocast():
        tb = batch.select(target).to(updater.device)
        mask = completion_mask(tb).to(updater.device)
        nll = -(token_logprobs(model, tb.input_ids, tb.attention_mask, mask)[0] * mask).sum() / mask.sum().clamp(min=1)
    g_target = _gradients(model, params, nll)
    for g, p in zip(g_target, params):
        pre = adam_preconditioner(updater.optimizer, p)
        if pre is not None:
            g.mul_(pre.to(g.device))  # P g_T: P is diagonal, so <g_T, P g_q> = <P g_T, g_q>
    keys = {batch.meta[i]["infuser_question"] for i in drafts} - {None}
    for key in sorted(keys):
        rows = [i for i, m in enumerate(batch.meta) if m.get("infuser_question") == key and roles[i] == "solver"]
        score = _question_influence(updater, batch, rows, params, g_target) if rows else 0.0
        for i in drafts:
            if batch.meta[i].get("infuser_question") == key:
                out[i, 0] = score
    return out


def _question_influence(updater: Any, batch: Batch, rows: list[int], params: list[torch.Tensor],
                        pre_target: list[torch.Tensor]) -> float:
    """<P g_T, g_q> of the solver rows `rows` of one question (0 when their rewards are all equal)."""
    rewards = batch.rewards[rows].float()
    adv = group_normalize(rewards, torch.zeros(len(rows), dtype=torch.long))  # cpu: the batch's rewards live there
    if not bool(adv.abs().gt(0).any()):
        return 0.0
    with updater.autocast():
        mb = batch.select(rows).to(updater.device)
        mask = mb.loss_mask.to(updater.device)
        lp = token_logprobs(updater.model, mb.input_ids, mb.attention_mask, mask)[0]
        surrogate = -((lp * mask).sum(1) * adv.to(lp.device)).sum() / mask.sum().clamp(min=1)
    grads = _gradients(updater.model, params, surrogate)
    return float(sum((a * b).sum() for a, b in zip(pre_target, grads)))


influence.whole_batch = True  # type: ignore[attr-defined]  # rollout_features calls it once on the whole batch
