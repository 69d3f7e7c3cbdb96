"""Each quantity against the formula a reference implementation uses, computed here from first principles
(plain loops, float64), never through upslope's own helpers.

References read (not copied): verl `verl/trainer/ppo/core_algos.py` (compute_grpo_outcome_advantage,
compute_rloo_outcome_advantage, compute_reinforce_plus_plus[_baseline]_outcome_advantage,
compute_gae_advantage_return, compute_policy_loss_vanilla, compute_policy_loss_gspo, agg_loss,
kl_penalty_forward) with `verl/utils/torch_functional.py` (masked_whiten) and
`verl/trainer/ppo/rollout_corr_helper.py`; slime `slime/utils/ppo_utils.py`; TRL `trl/trainer/grpo_trainer.py`
(dr_grpo loss) and `trl/experimental/cpo/cpo_trainer.py` (SimPO). Where upslope differs on purpose the test
pins the difference to what docs/methods.md ("Conventions") says.
"""
import math

import pytest
import torch
import torch.nn.functional as F
from algos_strategies import make_batch, sample_values
from hypothesis import given, settings
from hypothesis import strategies as st

from upslope.algos.advantages import dr_grpo, gae, grpo, reinforce_pp, rloo
from upslope.algos.aggregate import aggregate, loss_normalizers
from upslope.algos.correction import importance_correction
from upslope.algos.filters import nonzero_std
from upslope.algos.kl import k2, k3
from upslope.algos.losses import gspo, ppo_clip
from upslope.algos.preference import PairLogps, simpo
from upslope.algos.trust import proxy_parts

FAST = settings(max_examples=50, deadline=None)
GROUP_REWARD = st.sampled_from([0.0, 1.0, 0.5, -1.25, 2.0])
GROUPS = st.lists(st.lists(GROUP_REWARD, min_size=1, max_size=5), min_size=1, max_size=4)


def _groups_of(b):
    out = {}
    for i, g in enumerate(b.group_ids.tolist()):
        out.setdefault(g, []).append(i)
    return out


def _trained_rows(draw_masks, n, length):
    """loss masks with interior and trailing zeros, at least one trained token per row."""
    masks = []
    for i in range(n):
        m = draw_masks[i * length:(i + 1) * length]
        m[0] = 1
        masks.append(m)
    return masks


# ------------------------------------------------------------------ group advantages (verl)

@FAST
@given(GROUPS)
def test_grpo_dr_grpo_rloo_match_verl_per_group_formulas(groups):
    """verl: a group of n > 1 gets (r - mean) / (std_{n-1} + 1e-6) (GRPO), r - mean (Dr. GRPO) and
    r n/(n-1) - mean n/(n-1) (RLOO); a group of one gets mean 0, std 1 (r / (1 + 1e-6)) or its raw r.
    upslope's `singleton="raw"` is verl's up to that 1e-6 (docs/methods.md: conventions)."""
    b = make_batch(groups, comp_lens=[2] * sum(map(len, groups)))
    r = b.rewards.double().tolist()
    want_grpo, want_dr, want_rloo = [0.0] * len(r), [0.0] * len(r), [0.0] * len(r)
    for rows in _groups_of(b).values():
        n = len(rows)
        vals = [r[i] for i in rows]
        mean = sum(vals) / n
        for i in rows:
            if n == 1:
                want_grpo[i], want_dr[i], want_rloo[i] = r[i] / (1 + 1e-6), r[i], r[i]
                continue
            std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1))
            want_grpo[i] = (r[i] - mean) / (std + 1e-6)
            want_dr[i] = r[i] - mean
            want_rloo[i] = r[i] * n / (n - 1) - mean * n / (n - 1)
    for fn, want in ((grpo, want_grpo), (dr_grpo, want_dr), (rloo, want_rloo)):
        got = sample_values(fn(b, singleton="raw"), b).double()
        assert torch.allclose(got, torch.tensor(want, dtype=torch.float64), atol=5e-6), fn.__name__
    # the default gives a lone sample 0 (nothing to compare it with); larger groups are unchanged
    lone = torch.tensor([len(g) == 1 for g in groups for _ in g])
    default = sample_values(grpo(b), b).double()
    assert torch.all(default[lone] == 0)
    assert torch.allclose(default[~lone], torch.tensor(want_grpo, dtype=torch.float64)[~lone], atol=5e-6)


# ------------------------------------------------------------------ REINFORCE++ (verl)

def _verl_style_whiten(x, mask, eps=1e-8):
    """(x - mean) / sqrt(var_{n-1} + eps) over mask > 0 entries (verl's masked_whiten), 0 off the mask."""
    vals = [x[i][t] for i in range(len(x)) for t in range(len(x[i])) if mask[i][t]]
    mean = sum(vals) / len(vals)
    var = sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)
    return [[(x[i][t] - mean) / math.sqrt(var + eps) if mask[i][t] else 0.0 for t in range(len(x[i]))]
            for i in range(len(x))], mean, var


@FAST
@given(st.lists(GROUP_REWARD, min_size=2, max_size=5), st.sampled_from([1.0, 0.9, 0.5]), st.data())
def test_reinforce_pp_matches_verl_with_verl_options(rewards, gamma, data):
    """verl: returns by position, G_t = r_t + gamma G_{t+1}, reset to 0 after every mask-0 position,
    then whitened over the trained tokens with the n - 1 variance and eps 1e-8 inside the square root."""
    n, length = len(rewards), 5
    flat = data.draw(st.lists(st.sampled_from([0, 1, 1]), min_size=n * length, max_size=n * length))
    masks = _trained_rows(flat, n, length)
    b = make_batch([[x] for x in rewards], comp_lens=[length] * n, prompt_lens=[1] * n, loss_masks=masks)
    r = b.rewards.double().tolist()
    ret = []
    for i in range(n):
        last = max(t for t in range(length) if masks[i][t])
        tok = [r[i] if t == last else 0.0 for t in range(length)]
        g, row = 0.0, [0.0] * length
        for t in reversed(range(length)):
            g = tok[t] + gamma * g
            row[t] = g
            g *= masks[i][t]
        ret.append(row)
    if sum(map(sum, masks)) < 2 or len({ret[i][t] for i in range(n) for t in range(length) if masks[i][t]}) == 1:
        return  # verl's n - 1 variance needs two tokens; equal returns whiten to 0 in upslope (ties)
    want, _, _ = _verl_style_whiten(ret, masks)
    got = reinforce_pp(b, gamma=gamma, eps=1e-8, unbiased=True, eps_in_sqrt=True, reset_at_masked=True)
    assert torch.allclose(got[:, 1:].double(), torch.tensor(want, dtype=torch.float64), atol=1e-5)


@FAST
@given(st.lists(st.lists(GROUP_REWARD, min_size=2, max_size=4), min_size=1, max_size=3), st.data())
def test_reinforce_pp_baseline_differs_from_verl_only_by_the_documented_recentring(groups, data):
    """verl's REINFORCE++-baseline whitens x = r - group mean over the batch's tokens, re-centring on the
    token mean; upslope only divides by the std (docs/methods.md), so on every trained token of a group
    that is not tied upslope = verl + mean / sqrt(var + eps), one constant, and a tied group stays 0."""
    n, length = sum(map(len, groups)), 4
    flat = data.draw(st.lists(st.sampled_from([0, 1, 1]), min_size=n * length, max_size=n * length))
    masks = _trained_rows(flat, n, length)
    b = make_batch(groups, comp_lens=[length] * n, prompt_lens=[1] * n, loss_masks=masks)
    r = b.rewards.double().tolist()
    x = [[0.0] * length for _ in range(n)]
    tied = [False] * n
    for rows in _groups_of(b).values():
        mean = sum(r[i] for i in rows) / len(rows)
        for i in rows:
            tied[i] = len({r[j] for j in rows}) == 1
            x[i] = [r[i] - mean if masks[i][t] else 0.0 for t in range(length)]
    on = [x[i][t] for i in range(n) for t in range(length) if masks[i][t]]
    if len(set(on)) == 1:
        return
    verl, mean, var = _verl_style_whiten(x, masks)
    got = reinforce_pp(b, group_baseline=True, eps=1e-8, unbiased=True, eps_in_sqrt=True)[:, 1:].double()
    shift = mean / math.sqrt(var + 1e-8)
    for i in range(n):
        for t in range(length):
            if masks[i][t]:
                want = 0.0 if tied[i] else verl[i][t] + shift
                assert got[i, t].item() == pytest.approx(want, abs=1e-5)


# ------------------------------------------------------------------ GAE (verl)

@FAST
@given(st.integers(1, 4), st.integers(1, 6), st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.integers(0, 2**31 - 1))
def test_gae_matches_the_recursion_over_trained_tokens(n, length, gamma, lam, seed):
    """delta_t = r_t + gamma V(next trained token, 0 after the last) - V_t, A_t = delta_t + gamma lam A_next;
    mask-0 positions (tool output, padding) are skipped and their rewards and values ignored (verl's
    compute_gae_advantage_return); returns = A + V before whitening; whitened as verl with its options."""
    g = torch.Generator().manual_seed(seed)
    masks = _trained_rows((torch.rand(n * length, generator=g) < 0.7).long().tolist(), n, length)
    rewards = torch.randn(n, length, generator=g, dtype=torch.float64)
    values = torch.randn(n, length, generator=g, dtype=torch.float64)
    adv, ret = [[0.0] * length for _ in range(n)], [[0.0] * length for _ in range(n)]
    for i in range(n):
        pos = [t for t in range(length) if masks[i][t]]
        next_v, next_a = 0.0, 0.0
        for t in reversed(pos):
            a = rewards[i, t].item() + gamma * next_v - values[i, t].item() + gamma * lam * next_a
            adv[i][t], ret[i][t] = a, a + values[i, t].item()
            next_v, next_a = values[i, t].item(), a
    b = make_batch([[0.0]] * n, comp_lens=[length] * n, prompt_lens=[1] * n, loss_masks=masks)
    pad = torch.zeros(n, 1, dtype=torch.float64)
    b.token_rewards = torch.cat([pad, rewards], 1).float()
    b.values = torch.cat([pad, values], 1).float()
    got_adv, got_ret = gae(b, gamma=gamma, lam=lam, whiten=False)
    assert torch.allclose(got_adv[:, 1:].double(), torch.tensor(adv, dtype=torch.float64), atol=1e-4)
    assert torch.allclose(got_ret[:, 1:].double(), torch.tensor(ret, dtype=torch.float64), atol=1e-4)
    on = [adv[i][t] for i in range(n) for t in range(length) if masks[i][t]]
    if len(on) > 1 and max(on) - min(on) > 1e-3:
        want, _, _ = _verl_style_whiten(adv, masks)
        white, _ = gae(b, gamma=gamma, lam=lam, eps=1e-8, unbiased=True, eps_in_sqrt=True)
        assert torch.allclose(white[:, 1:].double(), torch.tensor(want, dtype=torch.float64), atol=1e-3)


# ------------------------------------------------------------------ policy losses (verl, slime)

def _tokens(seed, n=3, length=5, spread=1.5):
    g = torch.Generator().manual_seed(seed)
    lp = -torch.rand(n, length, generator=g, dtype=torch.float64) * 2
    old = lp + (torch.rand(n, length, generator=g, dtype=torch.float64) - 0.5) * 2 * spread
    adv = torch.randn(n, length, generator=g, dtype=torch.float64) * 2
    mask = (torch.rand(n, length, generator=g) < 0.75).double()
    mask[:, 0] = 1
    return lp, old, adv, mask


@FAST
@given(st.integers(0, 2**31 - 1), st.sampled_from([1.5, 3.0, 10.0]))
def test_ppo_dual_clip_matches_the_reference_value_and_gradient(seed, c):
    """Per token: l = max(-r A, -clip(r, 1 - 0.2, 1 + 0.28) A), and for A < 0 also min(l, -c A) (verl's
    compute_policy_loss_vanilla, slime's compute_policy_loss). The gradient wrt the log-prob is -A r
    where the unclipped term is the one taken, else 0; token_mean over the trained tokens."""
    lp, old, adv, mask = _tokens(seed)
    x = lp.clone().requires_grad_(True)
    loss, _ = ppo_clip(x, old, adv, mask, eps_low=0.2, eps_high=0.28, dual_clip=c)
    aggregate(loss, mask, "token_mean", **loss_normalizers(mask)).backward()
    ntok = mask.sum().item()
    for i in range(lp.shape[0]):
        for t in range(lp.shape[1]):
            if not mask[i, t]:
                assert loss[i, t] == 0 and x.grad[i, t] == 0
                continue
            r, a = math.exp(lp[i, t] - old[i, t]), adv[i, t].item()
            clipped = min(max(r, 0.8), 1.28)
            value, free = max(-r * a, -clipped * a), (-r * a >= -clipped * a)
            if a < 0 and value > -c * a:
                value, free = -c * a, False
            assert loss[i, t].item() == pytest.approx(value, rel=1e-9, abs=1e-12)
            assert x.grad[i, t].item() == pytest.approx(-a * r / ntok if free else 0.0, rel=1e-9, abs=1e-12)


@FAST
@given(st.integers(0, 2**31 - 1), st.sampled_from([0.05, 1e-3]))
def test_gspo_token_form_with_per_token_advantages(seed, spread):
    """GSPO-token (verl's compute_policy_loss_gspo): s_i = exp(mean of the row's log-ratios), the token
    ratio sg(s_i) p_t / sg(p_t): value s_i, gradient wrt lp_t s_i only. Per token, with its own A_t:
    l = max(-s A_t, -clip(s) A_t); under seq_mean_token_mean the gradient is -A_t s_i / (n_i N) where
    the unclipped term is taken, else 0."""
    lp, old, adv, mask = _tokens(seed, spread=spread)
    el, eh = 0.01, 0.02
    x = lp.clone().requires_grad_(True)
    loss, _ = gspo(x, old, adv, mask, eps_low=el, eps_high=eh)
    aggregate(loss, mask, "seq_mean_token_mean", **loss_normalizers(mask)).backward()
    rows = lp.shape[0]
    for i in range(rows):
        on = [t for t in range(lp.shape[1]) if mask[i, t]]
        s = math.exp(sum((lp[i, t] - old[i, t]).item() for t in on) / len(on))
        clipped = min(max(s, 1 - el), 1 + eh)
        for t in on:
            a = adv[i, t].item()
            free = -s * a >= -clipped * a
            assert loss[i, t].item() == pytest.approx(max(-s * a, -clipped * a), rel=1e-9)
            want = -a * s / (len(on) * rows) if free else 0.0
            assert x.grad[i, t].item() == pytest.approx(want, rel=1e-9, abs=1e-15)


# ------------------------------------------------------------------ KL estimators (verl, slime)

def test_kl_values_gradients_and_verls_value_clamp():
    """k2 = x^2 / 2 with gradient x; k3 = e^(ref - lp) - (ref - lp) - 1 with gradient 1 - e^(ref - lp)
    (verl kl_penalty_forward "mse"/"low_var_kl", slime compute_approx_kl). verl also clamps k3's value to
    [-10, 10] and slime does for "low_var_kl"; upslope keeps the value (docs/methods.md: KL log-ratio clamp)."""
    lp = torch.tensor([-1.0, -2.0, -0.1, -16.0], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([-1.5, -0.5, -0.1, -1.0], dtype=torch.float64)
    d = (ref - lp).detach()
    k3(lp, ref).sum().backward()
    assert torch.allclose(k3(lp, ref), d.exp() - d - 1)
    assert torch.allclose(lp.grad, 1 - d.exp())
    lp.grad = None
    k2(lp, ref).sum().backward()
    assert torch.allclose(lp.grad, -d)
    # lp - ref = -15: k3 = e^15 - 16 = 3269001.37, which verl reports as 10
    assert k3(lp, ref)[3].item() == pytest.approx(math.exp(15) - 16)


# ------------------------------------------------------------------ loss aggregation (TRL, verl)

def test_seq_sum_constant_is_trls_dr_grpo_loss_and_verls_norm_times_the_batch():
    """TRL's dr_grpo: sum(loss * mask) / (rows * max_completion_length). verl's seq-mean-token-sum-norm
    divides by the constant only (its batch factor is left to the gradient-accumulation scale): upslope's
    seq_sum_constant is TRL's, verl's / rows (docs/methods.md). Rows without a trained token (e.g. a
    masked truncated completion) are not counted in upslope, as in verl's seq-mean-* modes; TRL counts them."""
    loss = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, -1.0, 0.0, 0.0], [5.0, 5.0, 5.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    got = aggregate(loss, mask, "seq_sum_constant", constant=8.0, **loss_normalizers(mask)).item()
    assert got == pytest.approx((6 + 3) / (2 * 8))  # 0.5625
    assert got == pytest.approx((6 + 3) / 8 / 2)  # verl's 1.125 over the two trained rows
    assert got != pytest.approx((6 + 3) / (3 * 8))  # TRL with the empty row counted: 0.375


# ------------------------------------------------------------------ importance correction (verl), MIPU proxy

def test_importance_correction_and_proxy_count_inf_minus_inf_as_zero():
    """A trained token whose learner and sampler log-probs are both -inf has log-ratio inf - inf = NaN.
    Every policy loss and KL estimator counts it as 0 (docs/methods.md); the correction weights and the
    MIPU proxy gave NaN (the token weight, the whole row at the sequence levels, and so the loss). Now
    each token's log rho is clamped to +-20 with NaN as 0 (verl's rollout correction clamps at +-20)."""
    inf = math.inf
    old = torch.tensor([[-inf, -1.0, -0.5], [-0.2, -inf, 0.0]])
    sampler = torch.tensor([[-inf, -1.2, -0.5], [-0.1, -2.0, -inf]])
    mask = torch.ones(2, 3)
    w, m, metrics = importance_correction(old, sampler, mask, level="token", cap=2.0)
    # was [[nan, 1.2214, 1], [0.9048, 0, 2]]; the learner's -inf is now e^-20 of the sampler's, not 0
    want = torch.tensor([[1.0, math.exp(0.2), 1.0], [math.exp(-0.1), math.exp(-20.0), 2.0]])
    assert torch.allclose(w, want) and torch.equal(m, mask)
    assert metrics["mismatch_abs"].item() == pytest.approx((0.2 + 0.1 + 20 + 20) / 6)  # was nan
    # sequence: row 0 sums 0 + 0.2 + 0 (was nan), row 1 sums -0.1 - 20 + 20 = -0.1 (was nan)
    w, _, _ = importance_correction(old, sampler, mask, level="sequence", cap=2.0)
    assert torch.allclose(w, torch.tensor([[math.exp(0.2)] * 3, [math.exp(-0.1)] * 3]))
    w, m, _ = importance_correction(old, sampler, mask, level="geometric", cap=2.0, mask_low=0.5)
    assert torch.allclose(w, torch.tensor([[math.exp(0.2 / 3)] * 3, [math.exp(-0.1 / 3)] * 3]))
    gain, gap = proxy_parts(old, sampler, torch.ones(2, 3), mask)  # was (nan, ...)
    assert math.isfinite(gain) and math.isfinite(gap)
    assert gain == pytest.approx((0 + math.expm1(0.2) + 0 + math.expm1(-0.1) + math.expm1(-20) + math.expm1(20)) / 6)


# ------------------------------------------------------------------ DAPO dynamic sampling (verl's DAPO recipe)

def test_nonzero_std_drops_tied_and_single_sample_groups():
    """verl's DAPO recipe keeps a group with std > 0 or with a single sample; upslope keeps a group whose
    max - min > tol, so a group of one is dropped: under `singleton="zero"` (the default) its advantage
    is 0 anyway (the filter's docstring and docs/methods.md say so)."""
    b = make_batch([[1.0, 0.0], [1.0, 1.0], [0.7], [0.3, 0.3001]], comp_lens=[1] * 7)
    assert nonzero_std(b).tolist() == [True, True, False, False, False, True, True]
    assert nonzero_std(b, tol=0.01).tolist() == [True, True, False, False, False, False, False]


# ------------------------------------------------------------------ SimPO (TRL CPO trainer, SimPO repository)

def test_simpo_gamma_is_the_absolute_margin():
    """SimPO: -log sigmoid(beta (avg_c - avg_r) - gamma). TRL's CPO trainer writes it as
    beta (avg_c - avg_r - simpo_gamma / beta), so its simpo_gamma is our gamma; the SimPO repository's
    gamma_beta_ratio is gamma / beta (its beta 2.0, ratio 0.5: our defaults beta 2.0, gamma 1.0)."""
    pol = PairLogps(torch.tensor([-6.0, -3.0]), torch.tensor([-12.0, -2.0]),
                    torch.tensor([3.0, 2.0]), torch.tensor([4.0, 1.0]))
    avg_c, avg_r = torch.tensor([-2.0, -1.5]), torch.tensor([-3.0, -2.0])  # length-normalised by hand
    out = simpo(pol, beta=2.0, gamma=1.0)
    trl = -F.logsigmoid(2.0 * ((avg_c - avg_r) - 1.0 / 2.0))
    repo = -F.logsigmoid(2.0 * (avg_c - avg_r) - 2.0 * 0.5)
    assert torch.allclose(out.loss, trl) and torch.allclose(out.loss, repo)
    assert out.loss[0].item() == pytest.approx(math.log(1 + math.exp(-1.0)))  # h = 2 * 1 - 1 = 1: 0.3133
    assert out.loss[1].item() == pytest.approx(math.log(2.0))  # h = 2 * 0.5 - 1 = 0
    assert torch.allclose(out.chosen_reward, 2.0 * avg_c) and torch.allclose(out.rejected_reward, 2.0 * avg_r)
