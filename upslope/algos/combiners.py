"""Reward combiners: `fn(components {name: [N]}, group_ids [N], *, weights) -> rewards [N]`.

A combiner is per sample or per group unless registered `whole_batch=True` (it uses statistics of
the whole round, e.g. SAW's coefficients of variation): then a round is rewarded once complete, and
the learner does not stream its groups as they arrive."""
import torch
from torch import Tensor

from upslope.algos.common import Singleton, group_normalize
from upslope.bounds import Fraction, NonNegative, Positive, PositiveCount
from upslope.errors import ConfigError
from upslope.registry import REWARD_COMBINERS


def _weights(components: dict[str, Tensor], weights: dict[str, float] | None) -> dict[str, float]:
    """Weight per component: 1.0 unless given; a weight naming no component is an error (typo guard)."""
    if not components:
        raise ConfigError("reward combiner: no reward components to combine")
    weights = dict(weights or {})
    unknown = sorted(set(weights) - set(components))
    if unknown:
        raise ConfigError(f"reward weights name unknown components {unknown}; known: {sorted(components)}")
    return {name: float(weights.get(name, 1.0)) for name in components}


@REWARD_COMBINERS.register("weighted_sum", linear=True)
def weighted_sum(components: dict[str, Tensor], group_ids: Tensor, *,
                 weights: dict[str, float] | None = None) -> Tensor:
    """sum_k w_k * r_k (unlisted components weigh 1): the plain multi-reward combination.

    weights: weight per reward component name (unlisted weigh 1.0; an unknown name is an error)
    """
    w = _weights(components, weights)
    return sum(w[k] * components[k].to(torch.float32) for k in components)


@REWARD_COMBINERS.register("group_normalized_sum")
def group_normalized_sum(components: dict[str, Tensor], group_ids: Tensor, *,
                         weights: dict[str, float] | None = None, eps: NonNegative = 1e-6, unbiased: bool = True,
                         eps_in_sqrt: bool = False, singleton: Singleton = "zero") -> Tensor:
    """GDPO-style: sum_k w_k * (r_k - group mean) / (group std + eps), so no component dominates by scale.

    weights: weight per reward component name (unlisted weigh 1.0; an unknown name is an error)
    eps: added to the group std before dividing (>= 0)
    unbiased: group std with n - 1 (true) or the population n (false)
    eps_in_sqrt: divide by sqrt(var + eps) instead of (std + eps)
    singleton: a one-sample group gets 0 ("zero") or its raw component value ("raw", as verl)

    Float64 inside; the result has the components' float dtype (float32 at least). A
    component tied within a group adds exactly 0 there.
    """
    w = _weights(components, weights)
    dtype = torch.promote_types(next(iter(components.values())).dtype, torch.float32)
    total = sum(w[k] * group_normalize(components[k].to(torch.float64), group_ids, eps=eps, unbiased=unbiased,
                                       eps_in_sqrt=eps_in_sqrt, singleton=singleton) for k in components)
    return total.to(dtype)


def cv_weights(components: dict[str, Tensor], weights: dict[str, float] | None, eps: float = 1e-6) -> dict[str, float]:
    """SAW's weight per component: w_k * K * cv_k / sum_j cv_j, cv = batch std / (|batch mean| + eps).

    The weights keep the static weights' total scale (they sum to K times the mean static
    weight when every w_k is equal); when no component varies (every cv is 0) the static
    weights are returned unchanged.
    """
    w = _weights(components, weights)
    cv = {}
    for k, v in components.items():
        x = v.to(torch.float64)
        std = x.std(unbiased=False) if x.numel() > 1 else torch.zeros((), dtype=torch.float64)
        cv[k] = float(std / (x.mean().abs() + eps))
    total = sum(cv.values())
    if total <= 0:
        return w
    return {k: w[k] * len(cv) * cv[k] / total for k in components}


@REWARD_COMBINERS.register("saw", whole_batch=True)
def saw(components: dict[str, Tensor], group_ids: Tensor, *, weights: dict[str, float] | None = None,
        eps: Positive = 1e-6, group_normalize: bool = False) -> Tensor:
    """SAW (He et al. 2026): each component reweighted by its batch coefficient of variation, then summed.

    weights: static weight per reward component name (unlisted weigh 1.0), scaled by SAW
    eps: added to |batch mean| in cv = std / (|mean| + eps) (> 0), so an all-zero component gets cv 0
    group_normalize: sum the group-normalised components (SAW on GDPO) instead of the raw rewards (SAW on GRPO)

    A well-learned component (uniformly high, low variance) gets a small cv and so a small
    share; an under-learned, informative one a large share. The batch is this step's whole
    batch; the weights are recomputed every step (no smoothing across steps: our choice, the
    abstract names none). Population std (n).
    """
    if eps <= 0:
        raise ConfigError(f"saw eps must be > 0 (got {eps})")
    w = cv_weights(components, weights, eps)
    if group_normalize:
        return group_normalized_sum(components, group_ids, weights=w)
    return weighted_sum(components, group_ids, weights=w)


@REWARD_COMBINERS.register("confidence_gated_cost")
def confidence_gated_cost(components: dict[str, Tensor], group_ids: Tensor, *, weights: dict[str, float] | None = None,
                          correct: str = "correct", tool: str = "tool", cost: NonNegative = 0.3,
                          threshold: Fraction = 0.5, min_native: PositiveCount = 2) -> Tensor:
    """Translate-R1's cost-aware tool use: the weighted sum of every component but `tool`, minus `cost` for a
    sample that used the tool where its group shows the policy can do without: at least `min_native` of the
    group's samples skipped the tool and their mean `correct` is at least `threshold`. Where the policy
    cannot answer unaided, calling the tool costs nothing.

    weights: weight per reward component name (unlisted weigh 1.0; `tool` is an indicator, never summed)
    correct: the component that says a sample is right
    tool: the component that is > 0 when a sample called the tool (e.g. the answer environment's `tool` part)
    cost: what an avoidable tool call costs
    threshold: the unaided success rate from which the policy counts as confident
    min_native: unaided samples a group needs before its success rate is trusted
    """
    for name in (correct, tool):
        if name not in components:
            raise ConfigError(f"confidence_gated_cost: no reward component '{name}'; known: {sorted(components)}")
    used = components[tool].to(torch.float32) > 0
    right = components[correct].to(torch.float32)
    gate = torch.zeros_like(used)
    for g in group_ids.unique():
        members = group_ids == g
        native = members & ~used
        if int(native.sum()) >= min_native and float(right[native].mean()) >= threshold:
            gate |= members
    rest = {k: v for k, v in components.items() if k != tool}
    kept = {k: w for k, w in (weights or {}).items() if k != tool}
    return weighted_sum(rest, group_ids, weights=kept) - cost * (used & gate).to(torch.float32)
