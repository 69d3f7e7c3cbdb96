"""Feedback samplers (CERO, ADS-style boundary, boundary-aware, CoDaPO resampling), by hand-computed cases."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from run_helpers import metrics, trained

from upslope.config import DataConfig, Plugin
from upslope.data.samplers import BoundaryAwareSampler, BoundarySampler, CeroSampler, make_sampler
from upslope.data.types import Example
from upslope.errors import ConfigError


def feed(sampler, outcomes: dict[int, list[float]]) -> None:
    """Report one group per prompt: prompt -> its samples' rewards."""
    indices = list(outcomes)
    rewards = torch.tensor([r for p in indices for r in outcomes[p]])
    gids = torch.tensor([g for g, p in enumerate(indices) for _ in outcomes[p]])
    sampler.update(indices, rewards, gids)


def test_counts_follow_groups_to_their_prompts():
    s = BoundarySampler(5, seed=0)
    feed(s, {3: [1.0, 0.0, 1.0, 0.2], 1: [0.0, 0.0]})
    feed(s, {3: [0.5, 0.0]})
    assert s.successes.tolist() == [0, 0, 0, 3, 0] and s.trials.tolist() == [0, 2, 0, 6, 0]
    rate = s.pass_rate()
    assert rate[3] == pytest.approx(0.5) and rate[1] == 0 and torch.isnan(rate[0])


def test_cero_posterior_value_by_hand():
    s = CeroSampler(3, seed=0, prior_alpha=1.0, prior_beta=1.0, saturation=4.0)
    feed(s, {0: [1, 1, 1, 1, 0, 0, 0, 0], 1: [0] * 8})
    # prompt 0: Beta(5, 5) -> 25 / (10 * 11); prompt 1: Beta(1, 9) -> 9 / 110; prompt 2: Beta(1, 1) -> 1 / 6
    assert s.value().tolist() == pytest.approx([25 / 110, 9 / 110, 1 / 6])
    assert s.next(2) == [0, 2]  # highest posterior variance first
    # each was drawn once: value / (1 + 1/4)
    assert s.value().tolist() == pytest.approx([25 / 110 / 1.25, 9 / 110, 1 / 6 / 1.25])
    assert s.next(1) == [0]  # 0.1818 > 0.1333 > 0.0818


def test_cero_saturation_moves_budget_to_other_prompts():
    s = CeroSampler(2, seed=1, saturation=1.0)
    feed(s, {0: [1, 0], 1: [1, 1, 1, 0]})  # Beta(2,2): 0.2; Beta(4,2): 8/42 = 0.1905
    assert s.next(1) == [0]
    assert s.next(1) == [1]  # 0.2 / 2 = 0.1 < 0.1905


def test_cero_gives_a_high_variance_prompt_several_groups():
    s = CeroSampler(3, seed=0, saturation=4.0, max_groups=2)
    feed(s, {0: [1, 1, 1, 1, 0, 0, 0, 0], 1: [0] * 8})  # values 25/110, 9/110, 1/6 as above
    # group 1 -> prompt 0; its value drops to 0.1818 > 1/6, so group 2 -> prompt 0 again; then it is at max_groups
    assert s.next(3) == [0, 0, 2]
    assert s.prompt_draws.tolist() == [2, 0, 1]


def test_cero_uniform_prior_is_a_seeded_shuffle():
    a, b, c = CeroSampler(50, seed=3), CeroSampler(50, seed=3), CeroSampler(50, seed=4)
    first = a.next(8)
    assert first == b.next(8) and first != c.next(8) and len(set(first)) == 8


def test_boundary_pool_and_pacing():
    s = BoundarySampler(20, seed=0, max_share=0.5, pace_steps=2)
    feed(s, {4: [1, 0], 5: [1, 1], 6: [0, 0], 7: [0, 1]})  # boundary: 4 and 7 (5 solved, 6 unsolved)
    assert torch.nonzero(s.pool()).flatten().tolist() == [4, 7]
    first = s.next(4)  # draw 1: share 0 -> the uniform order only
    assert s.pool_share() == 0.0 and first == BoundarySampler(20, seed=0).next(4)
    second = s.next(4)  # draw 2: share 0.5 * 1/2 -> one boundary prompt, then uniform ones without repeats
    assert s.pool_share() == pytest.approx(0.25)
    assert second[0] in (4, 7) and len(set(second)) == 4
    s.next(4)
    assert s.pool_share() == pytest.approx(0.5)  # fully paced from draw 3
    assert len(first) == 4


def test_boundary_aware_locates_then_consolidates():
    s = BoundaryAwareSampler(30, seed=0, locate_steps=1, consolidate_below=0.75, share=0.5)
    u = BoundaryAwareSampler(30, seed=0, locate_steps=1)
    assert s.next(4) == u.next(4)  # locate phase: the uniform order
    feed(s, {2: [1, 0, 0, 0], 3: [1, 1, 1, 1], 9: [0, 0, 0, 0], 11: [1, 1, 0, 1]})
    # pass@4 > 0 and rate < 0.75: prompt 2 (0.25); 3 is solved, 9 is beyond the boundary, 11 is at 0.75
    assert torch.nonzero(s.pool()).flatten().tolist() == [2]
    out = s.next(4)
    assert out[0] == 2 and len(out) == 4 and 2 not in out[1:]


@pytest.mark.parametrize("cls", [BoundarySampler, BoundaryAwareSampler, CeroSampler])
def test_state_round_trip_resumes_the_same_draws(cls):
    a = cls(40, seed=5)
    for _ in range(3):
        idx = a.next(4)
        feed(a, {i: [float(i % 3 == 0), float(i % 2 == 0)] for i in idx})
    b = cls(40, seed=5)
    b.load_state_dict(a.state_dict())
    for _ in range(4):
        x, y = a.next(4), b.next(4)
        assert x == y
        feed(a, {i: [1.0, 0.0] for i in x})
        feed(b, {i: [1.0, 0.0] for i in y})


def test_make_sampler_checks_options():
    data = DataConfig(sampler=Plugin(name="cero", options={"saturation": 2.0}))
    assert make_sampler(data, 10, 0).saturation == 2.0
    with pytest.raises(ConfigError, match="data.sampler.options.budget: unknown option"):
        make_sampler(DataConfig(sampler=Plugin(name="cero", options={"budget": 3})), 10, 0)


def clustered(power: float = 1.0) -> BoundarySampler:
    """Prompts 0-2 in cluster x, 3-5 in y; boundary prompts 0 (x), 3 and 4 (y); 1 solved, 5 unsolved, 2 unseen."""
    examples = [Example(prompt=str(i), meta={"c": "xy"[i // 3]}, id=str(i)) for i in range(6)]
    s = BoundarySampler(6, seed=0, examples=examples, cluster_key="c", cluster_power=power)
    feed(s, {0: [1, 0], 1: [1, 1], 3: [0, 1], 4: [1, 0], 5: [0, 0]})
    return s


def test_ads_cluster_weights_by_hand():
    s = clustered()
    assert s.clusters.tolist() == [0, 0, 0, 1, 1, 1]
    # x: 1 boundary of 2 sampled -> (1 + 1) / (2 + 2); y: 2 of 3 -> 3 / 5
    assert s.cluster_weights().tolist() == pytest.approx([0.5, 0.6])
    assert clustered(2.0).cluster_weights().tolist() == pytest.approx([0.25, 0.36])
    assert clustered(0.0).cluster_weights().tolist() == [1.0, 1.0]


def test_ads_picks_a_cluster_by_weight_then_a_boundary_prompt_in_it():
    pool = torch.tensor([0, 3, 4])
    s = clustered()
    firsts = [s.pick(pool, 1, torch.Generator().manual_seed(k))[0] for k in range(3000)]
    share_y = sum(i in (3, 4) for i in firsts) / len(firsts)
    assert share_y == pytest.approx(0.6 / 1.1, abs=0.03)  # P(y) = 0.6 / (0.5 + 0.6)
    assert abs(sum(i == 3 for i in firsts) - sum(i == 4 for i in firsts)) < 0.1 * len(firsts)  # uniform inside y
    sharp = clustered(60.0)  # (0.6 / 0.5) ** 60 ~ 5e4: y nearly always
    assert all(sharp.pick(pool, 1, torch.Generator().manual_seed(k))[0] in (3, 4) for k in range(200))
    every = s.pick(pool, 3, torch.Generator().manual_seed(1))
    assert sorted(every) == [0, 3, 4]  # each pool prompt once: a picked one leaves its cluster
    batch = s.next(4)  # through next(): draw 1 has share 0, so this is the uniform order
    assert len(set(batch)) == 4


def test_ads_clusters_need_the_field():
    examples = [Example(prompt="q", meta={}, id="q7")]
    with pytest.raises(ConfigError, match="cluster_key=c: example q7 has no field 'c'"):
        BoundarySampler(1, examples=examples, cluster_key="c")
    with pytest.raises(ConfigError, match="was not given the training examples"):
        BoundarySampler(1, cluster_key="c")
    data = DataConfig(sampler=Plugin(name="boundary", options={"cluster_key": "carries"}))
    arith = [Example(prompt="p", meta={"carries": k % 3}) for k in range(9)]
    assert make_sampler(data, 9, 0, arith).clusters.tolist() == [0, 1, 2] * 3  # examples passed through


def test_cero_merges_a_prompts_draws_into_one_group_by_default():
    assert CeroSampler(4).merge_repeats and not CeroSampler(4, merge_groups=False).merge_repeats
    assert not getattr(BoundarySampler(4), "merge_repeats", False)


def test_codapo_resamples_seen_questions_by_value():
    """Prompt 0: rewards 1, 0, 0, 0 at confidence 0 -> p 1/4, value 4 x 1/4 x 3/4 x 1 = 0.75; prompt 1: rewards
    1, 0 at confidences 0.4, 0.6 -> value 4 x 1/2 x 1/2 x (1 - 0.5) = 0.5; prompt 3: all right -> 0 (never
    re-drawn). share 0.5 of 4: two re-draws, i.e. both of {0, 1}; of 1 per batch, 0 is picked 0.75 / 1.25."""
    from upslope.data.samplers import CodapoSampler

    s = CodapoSampler(6, seed=0, share=0.5)
    prompts, rewards, conf = [0, 1, 3], [1.0, 0, 0, 0, 1.0, 0, 1.0, 1.0], [0, 0, 0, 0, 0.4, 0.6, 0.9, 0.9]
    gids = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2])
    s.update(prompts, torch.tensor(rewards), gids, confidence=torch.tensor(conf))
    assert s.value.tolist() == pytest.approx([0.75, 0.5, 0, 0, 0, 0])
    batch = s.next(4)
    assert sorted(batch[:2]) == [0, 1] and len(set(batch)) == 4
    picks = [CodapoSampler.pick(s, torch.tensor([0, 1]), 1, torch.Generator().manual_seed(k))[0] for k in range(2000)]
    assert picks.count(0) / 2000 == pytest.approx(0.6, abs=0.04)
    s.update([0], torch.tensor([1.0, 1.0]), torch.tensor([0, 0]), confidence=torch.tensor([0.5, 0.5]))
    assert s.value[0] == 0 and float(s.value[1]) == pytest.approx(0.5)  # a question's latest value replaces its last
    again = CodapoSampler(6, seed=0, share=0.5)
    again.load_state_dict(s.state_dict())
    assert again.next(2) == s.next(2)
    with pytest.raises(ConfigError, match="confidence"):
        s.update([0], torch.tensor([1.0]), torch.tensor([0]))


def test_codapo_sampler_is_fed_confidences_in_training(tiny_model_path, tmp_path):
    """Two GRPO steps on the tiny model with data.sampler=codapo (a coin-flip reward): the trainer gives its
    update the samples' confidences, and each sampled prompt's value is 4p(1 - p)(1 - c) of its rollouts."""
    from upslope.config import load_config
    from upslope.train.trainers.rl import Trainer

    toy = Path(__file__).resolve().parents[1] / "fixtures" / "toy_rewards.py"
    cfg = load_config(None, [f"model.name={tiny_model_path}", "engine.name=hf", f"run_dir={tmp_path / 'run'}",
                             "log.progress=false", "log.tensorboard=false", "log.plot=false", "rollout.prompts_per_step=2",
                             "rollout.n=4", "rollout.max_new_tokens=4", "train.eval_before=false", "train.eval_after=false",
                             "train.steps=2", "train.threads=1", "train.micro_batch_tokens=512", "data.options.count=8",
                             "data.sampler.name=codapo", "data.sampler.options.share=0.5",
                             f"reward=[{{name: '{toy}:even_length'}}]"])
    trainer = Trainer(cfg)
    try:
        trainer.run()
        s = trainer.sampler
    finally:
        trainer.close()
    assert int(s.trials.sum()) == 16 and bool(((s.value >= 0) & (s.value <= 1)).all())
    seen = s.trials > 0
    p = s.successes[seen] / s.trials[seen]
    assert bool((s.value[seen] <= 4 * p * (1 - p) + 1e-6).all())  # (1 - c) <= 1, c > 0 for a sampled reply


def test_boundary_aware_guides_prompts_beyond_the_boundary():
    """Four prompts and their guided copies (indices 4-7: the hint is the answer's first half, at least one
    character). Located at step 1: 1 and 3 never solved (beyond), 0 half solved (the pool). At step 2 every
    prompt is drawn: 0 from the pool, 2 as itself, 1 and 3 as their guided copies 5 and 7, whose outcomes do not
    count toward the boundary."""
    from upslope.data.samplers import sampler_examples

    examples = [Example(prompt="What is 12 + 34?", answer=46, id="a"), Example(prompt="What is 60 + 63?", answer=123),
                Example(prompt=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "5 + 2?"}],
                        answer=7), Example(prompt="What is 1 + 1?", answer=2)]
    data = DataConfig(sampler=Plugin(name="boundary_aware", options={"locate_steps": 1, "share": 0.5,
                                                                     "guidance": "answer_prefix", "hint_share": 0.5}))
    guided = sampler_examples(data, examples)
    assert [g.prompt for g in (guided[0], guided[1], guided[3])] == [
        "What is 12 + 34? (Hint: the answer begins with 4.)", "What is 60 + 63? (Hint: the answer begins with 12.)",
        "What is 1 + 1? (Hint: the answer begins with 2.)"]
    assert guided[2].prompt[1]["content"] == "5 + 2? (Hint: the answer begins with 7.)" and examples[2].prompt[1]["content"] == "5 + 2?"
    assert guided[0].id == "a-guided" and guided[0].answer == 46 and guided[0].meta["metrics"] == {"boundary/guided": 1.0}
    s = make_sampler(data, 8, 0, examples + guided)
    assert sorted(s.next(4)) == [0, 1, 2, 3]  # locate: the task's own prompts only
    feed(s, {0: [1.0, 0.0], 1: [0.0, 0.0], 2: [1.0, 1.0], 3: [0.0, 0.0]})
    out = s.next(4)
    assert out[0] == 0 and sorted(out) == [0, 2, 5, 7]
    feed(s, {0: [1.0, 1.0], 5: [1.0, 1.0], 2: [1.0, 0.0], 7: [0.0, 0.0]})
    assert s.successes.tolist() == [3, 0, 3, 0] and s.trials.tolist() == [4, 2, 4, 2]
    assert sampler_examples(DataConfig(sampler=Plugin(name="boundary_aware")), examples) == []  # guidance off
    with pytest.raises(ConfigError, match="no reference answer"):
        sampler_examples(data, [Example(prompt="x")])


def test_boundary_guidance_in_training(tiny_model_path, tmp_path):
    """Three steps on the tiny model, which solves nothing: step 1 locates every drawn prompt beyond the
    boundary, and from step 2 each of them comes back as its guided copy (the hinted prompt, logged)."""
    from upslope.config import load_config
    from upslope.train.trainers.rl import Trainer

    run = tmp_path / "run"
    cfg = load_config(None, [f"model.name={tiny_model_path}", "engine.name=hf", f"run_dir={run}",
                             "log.progress=false", "log.tensorboard=false", "log.plot=false", "rollout.prompts_per_step=2",
                             "rollout.n=2", "rollout.max_new_tokens=4", "train.eval_before=false", "train.eval_after=false",
                             "train.steps=3", "train.threads=1", "train.micro_batch_tokens=512", "data.options.count=2",
                             "data.sampler.name=boundary_aware", "data.sampler.options.locate_steps=1",
                             "data.sampler.options.guidance=answer_prefix"])
    trained(Trainer(cfg))
    rows = [r for r in metrics(run) if "loss" in r]
    assert [r.get("boundary/guided", 0.0) for r in rows] == [0.0, 1.0, 1.0]
    assert rows[0]["reward/mean"] == 0.0  # located: nothing solved
