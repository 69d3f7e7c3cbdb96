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


def min_norm_weights(grads: Tensor, iters: int = 50) -> Tensor:
    """Convex weights w (w >= 0, sum 1) minimising |sum_k w_k g_k|, for gradients `grads` [K, N]: the
    multiple-gradient descent algorithm's common direction, by Frank-Wolfe on the Gram matrix (exact
    line search each step). Two gradients have the closed form w_1 = clip((g2 - g1).g2 / |g1 - g2|^2, 0, 1)."""
    k = grads.shape[0]
    gram = grads @ grads.T
    w = torch.full((k,), 1.0 / k, dtype=grads.dtype)
    for _ in range(iters):
        t = int(torch.argmin(gram @ w))  # the vertex most opposed to the current direction
        d = torch.zeros_like(w)
        d[t] = 1.0
        d -= w
        curv = d @ gram @ d
        if curv <= 1e-12:
            break
        step = float((-(w @ gram @ d) / curv).clamp(0.0, 1.0))
        if step <= 1e-9:
            break
        w = w + step * d
    return w


@REWARD_COMBINERS.register("more", whole_batch=True)
def more(components: dict[str, Tensor], group_ids: Tensor, *, constraints: dict[str, float] | None = None,
         weights: dict[str, float] | None = None, violation: float = -1.0) -> Tensor:
    """MORE: constraint components gate the reward; the objectives are summed with weights from their gradients.

    constraints: component name -> threshold: a sample meets it when the component is >= the threshold
    weights: static weight per component (multiplies the adaptive weight of an objective; a constraint's is unused)
    violation: the reward of a sample that misses any constraint (below every objective sum it should be)

    A sample that meets every constraint gets sum_k w_k r_k over the objectives (the components
    not named in `constraints`); one that misses any gets `violation`. The objectives' weights come
    from gradient feedback: under GRPO an objective pushes the policy along sum_i z_ik grad log p(y_i),
    z_k its group-normalised values over the feasible samples, so (taking the samples' score
    functions as orthonormal) z_k is its gradient in sample space, and the weights are the
    min-norm convex combination of those gradients (MGDA), the direction that improves every
    objective at once instead of oscillating between them. An objective without variance among the
    feasible samples has no gradient and weight 0 (all weights equal when none varies). The abstract
    (Li et al. 2026) names constraints and gradient-feedback reweighting without their form: the
    gate, the sample-space gradients and MGDA are our choices. Weights are recomputed every round.
    """
    w_static = _weights(components, weights)
    constraints = dict(constraints or {})
    unknown = sorted(set(constraints) - set(components))
    if unknown:
        raise ConfigError(f"reward combiner 'more': constraints name unknown components {unknown}; "
                          f"known: {sorted(components)}")
    objectives = [k for k in components if k not in constraints]
    if not objectives:
        raise ConfigError("reward combiner 'more': every component is a constraint; leave at least one objective")
    n = len(next(iter(components.values())))
    feasible = torch.ones(n, dtype=torch.bool)
    for k, threshold in constraints.items():
        feasible &= components[k].to(torch.float64) >= threshold
    w = more_weights({k: components[k] for k in objectives}, group_ids, feasible)
    total = sum(w[k] * w_static[k] * components[k].to(torch.float64) for k in objectives)
    return torch.where(feasible, total, torch.full_like(total, violation)).to(torch.float32)


def more_weights(objectives: dict[str, Tensor], group_ids: Tensor, feasible: Tensor) -> dict[str, float]:
    """MORE's adaptive weight per objective: MGDA over the group-normalised values of the feasible samples."""
    names = list(objectives)
    sel = torch.nonzero(feasible).flatten()
    grads = torch.stack([group_normalize(objectives[k].to(torch.float64)[sel], group_ids[sel]) for k in names]) \
        if sel.numel() else torch.zeros(len(names), 0, dtype=torch.float64)
    live = grads.abs().sum(dim=1) > 0
    if not bool(live.any()):
        return {k: 1.0 / len(names) for k in names}
    w = torch.zeros(len(names), dtype=torch.float64)
    w[live] = min_norm_weights(grads[live])
    return {k: float(w[i]) for i, k in enumerate(names)}


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
