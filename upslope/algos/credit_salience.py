"""Salience-weighted GRPO advantages: FlowTracer, ARCA, GRAIL.

Each is registered with `salience=SOURCE`; the RL trainer then computes the batch's per-token
salience from the policy (`upslope.train.learner.salience`, one extra pass) and passes it as the
second argument. The advantage of each rollout is redistributed over its tokens by salience,
normalised to mean 1 over the row (so a rollout's total credit is GRPO's), mixed with uniform
credit by `mix`. Tied groups keep exactly 0.
"""
import torch
from torch import Tensor

from upslope.algos.common import broadcast_to_tokens
from upslope.algos.credit import grpo_per_sample
from upslope.batch import Batch
from upslope.bounds import Fraction, PositiveCount
from upslope.errors import ConfigError
from upslope.registry import ADVANTAGES


def salience_weights(salience: Tensor, mask: Tensor, mix: float) -> Tensor:
    """(1 - mix) + mix x salience / (row mean of salience over trained tokens), on trained tokens; a
    row with no salience at all gets uniform weights. Each row's weights average 1."""
    on = (mask > 0).to(torch.float64)
    s = salience.to(torch.float64).clamp(min=0) * on
    mean = s.sum(1, keepdim=True) / on.sum(1, keepdim=True).clamp(min=1)
    norm = torch.where(mean > 0, s / mean.clamp(min=1e-300), on)
    return ((1 - mix) + mix * norm) * on


def _weighted(batch: Batch, salience: Tensor | None, mix: float, who: str, answer_tokens: int) -> Tensor:
    if not 0 <= mix <= 1 or answer_tokens < 1:
        raise ConfigError(f"{who} needs 0 <= mix <= 1 and answer_tokens >= 1 (got {mix}, {answer_tokens})")
    if salience is None:
        raise ConfigError(f"advantage '{who}' needs the policy's token salience (the RL trainer computes it)")
    adv = broadcast_to_tokens(grpo_per_sample(batch, who), batch.loss_mask).to(torch.float64)
    return (adv * salience_weights(salience, batch.loss_mask, mix)).float()


@ADVANTAGES.register("flowtracer", grouped=True, salience="attention_flow")
def flowtracer(batch: Batch, salience: Tensor | None = None, *, mix: Fraction = 0.5,
               answer_tokens: PositiveCount = 3) -> Tensor:
    """FlowTracer (Dong et al. 2026): GRPO advantage redistributed by attention flow into the answer region.

    mix: weight of the salience redistribution (0: GRPO; 1: fully by salience)
    answer_tokens: the answer region, each rollout's last trained tokens (>= 1)

    Our choices: edge capacities are the attention weights averaged over layers and heads (a
    causal, row-stochastic DAG, so flow is conserved); a token's credit is the flow through it
    into the answer region (the backbone extraction is not separate). Costs one eager-attention forward.
    """
    return _weighted(batch, salience, mix, "flowtracer", answer_tokens)


@ADVANTAGES.register("arca", grouped=True, salience="adapter_residual")
def arca(batch: Batch, salience: Tensor | None = None, *, mix: Fraction = 0.5,
         answer_tokens: PositiveCount = 3) -> Tensor:
    """ARCA (Lafuente-Mercado 2026): GRPO advantage redistributed by the LoRA adapter's hidden-state residual norm.

    mix: weight of the salience redistribution (0: GRPO; 1: fully by salience)
    answer_tokens: unused by ARCA's salience (kept for the shared salience interface)

    Salience of token t is ||h_adapted - h_base|| of the last layer's state that chooses it; needs
    LoRA. Costs two forwards (adapter on, off). At the first step the adapter is zero (LoRA's B = 0),
    so every row is uniform (GRPO) until the adapter has moved.
    """
    return _weighted(batch, salience, mix, "arca", answer_tokens)


@ADVANTAGES.register("grail", grouped=True, salience="gradient")
def grail(batch: Batch, salience: Tensor | None = None, *, mix: Fraction = 0.5,
          answer_tokens: PositiveCount = 3) -> Tensor:
    """GRAIL (Pala et al. 2026): GRPO advantage redistributed by gradient x activation saliency toward the answer.

    mix: weight of the salience redistribution (0: GRPO; 1: fully by salience)
    answer_tokens: the answer region whose summed log-prob is differentiated (>= 1)

    Our choices: the activation is the input embedding, the saliency |grad . embedding| of the
    answer region's log-prob; a rollout's last token, which no later prediction depends on, gets 0
    (its share then comes from `mix`). Costs a forward and a backward to the embeddings (no weight gradients).
    """
    return _weighted(batch, salience, mix, "grail", answer_tokens)
