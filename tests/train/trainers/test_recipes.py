"""Every RL recipe in recipes/ runs 2 training steps on a tiny model (HF engine). Recipes of the
other commands (they configure an `sft`, `rft`, `dpo`, `distill`, `rm` or `randopt` section) are run by their
own trainers' tests in tests/train/trainers. A recipe rewarded by a trained reward model gets a
tiny one (the tiny model with a scalar head)."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
from markers import IN_CI_SLOW_SET
import torch
import yaml
from run_helpers import metrics, trained

from upslope.config import RewardSpec, load_config
from upslope.data import task_default_reward
from upslope.train.trainers.rl import Trainer, check_config

OTHER_COMMANDS = ("sft", "rft", "dpo", "distill", "rm", "randopt")
TOY = Path(__file__).resolve().parents[2] / "fixtures" / "toy_rewards.py"


def is_rl_recipe(path: Path) -> bool:
    raw = yaml.safe_load(path.read_text()) or {}
    if any(k in raw for k in OTHER_COMMANDS):
        return False
    return is_rl_recipe(path.parent / raw["base"]) if raw.get("base") else True


RECIPES = [r for r in sorted((Path(__file__).resolve().parents[3] / "recipes").glob("*.yaml")) if is_rl_recipe(r)]
# Recipes of the seed methods (docs/methods.md): each plugin has its own mechanism tests, so their
# 2-step runs are in the slow set (-m slow); every recipe's config is still checked in the default run.
SEED_METHOD_RECIPES = {"cero", "ads", "boundary_curriculum", "replay", "rerule", "dppo", "drpo", "dcmdp", "mipu",
                       "saw", "gd2po", "recal", "calibration", "selective", "suco", "darts", "espo", "denoise",
                       "socratic", "arena", "drift"}
SEED_METHOD_RECIPES |= {"ah_grpo", "sa_ah_grpo", "rredcot", "graphae", "consteer", "consteer_outcome", "ispo", "codapo",
                        "paec", "sr_ppo", "flowtracer", "grail", "arca", "headroom_lora"}  # token credit
SEED_METHOD_RECIPES |= {"treerpo", "catpo", "td_grokking"}  # tree rollouts and decomposition
SEED_METHOD_RECIPES |= {"c3rl", "disco", "more", "sear", "confidence_multi", "think_answer", "opera", "gsm8k",
                        "exprl", "turing", "geoalign", "bmc", "geomin",
                        "pivottrace"}  # rewards and sampling, part 3
SEED_METHOD_RECIPES |= {"dirl", "pum", "hista", "numca"}  # hidden-state directions, prefix utility, state values
SEED_METHOD_RECIPES |= {"balto", "saerl", "e3rl", "resum"}  # credit and sampling, part 3 (continued)
SEED_METHOD_RECIPES |= {"infuser", "infuser_difficulty"}  # self-evolution: drafting questions, solving them
SEED_METHOD_RECIPES |= {"sql", "progress_sql", "ctc_grpo", "3spo", "knapsack", "opt", "tool_choice", "translate_r1", "self_report", "self_ctrl"}  # Text-to-SQL: one-shot and Progress-SQL (multi-turn)
SEED_METHOD_RECIPES |= {"confidence", "headroom_format", "headroom_gdpo"}  # baselines on the confidence and headroom tasks
SLOW_RECIPES = SEED_METHOD_RECIPES | {"grpo_judge"}  # grpo_judge: a 135M judge grades every sample on the CPU
# variants of a recipe the default run trains (another task, the SFT half of an agent recipe, a k=1 critic): in CI
CI_RECIPES = {"reasoning_gym_basic_arithmetic", "reasoning_gym_chain_sum", "reasoning_gym_gcd", "agent_calculator_sft",
              "agent_python_sft", "skyrl_gym_arith", "headroom", "sr_ppo_k1"}
RUNS = [pytest.param(r, id=r.stem, marks=[pytest.mark.slow] if r.stem in SLOW_RECIPES else
                     IN_CI_SLOW_SET if r.stem in CI_RECIPES else []) for r in RECIPES]
# advantages that read named reward components (a verifier, a self-reward) get them pointed at the signal reward
# below, which the tiny model's samples differ in (its verifier and majority-vote rewards are all 0)
READ_SIGNAL = ["algo.advantage.options.correct=long_text", "algo.advantage.options.self_reward=long_text"]
COMPONENT_READERS = {"geomin": [*READ_SIGNAL, "algo.advantage.options.labelled_share=0.5",
                                "algo.advantage.options.fallback_weight=1.0"],
                     "pivottrace": READ_SIGNAL, "balto": ["algo.advantage.options.outcome=long_text"]}
# the tiny random model never drafts a well-formed question: a prefill writes one, so its answers are sampled
WRITE_DRAFT = ['rollout.options.prefill="Question: What is 2 + 3?\\nAnswer: 5\\n"']
COMPONENT_READERS |= {"infuser": WRITE_DRAFT, "infuser_difficulty": WRITE_DRAFT}
# recipes of an optional extra: they run where its package is installed
NEEDS = {"openai_agent_python": "openai", "reasoning_gym": "reasoning_gym", "reasoning_gym_chain_sum": "reasoning_gym",
         "reasoning_gym_basic_arithmetic": "reasoning_gym", "reasoning_gym_gcd": "reasoning_gym", "skyrl_gym_arith": "skyrl_gym",
         "verifiers_products": "verifiers"}


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.stem for r in RECIPES])
def test_recipe_config_is_valid(recipe, tmp_path):
    """Loads, validates and passes the RL trainer's own checks (plugin options included) without a model."""
    cfg = load_config(recipe, [f"run_dir={tmp_path}"])
    check_config(cfg)


def test_seed_method_recipes_exist():
    """The slow set names real recipes (a renamed recipe would silently leave both sets)."""
    assert SLOW_RECIPES | CI_RECIPES <= {r.stem for r in RECIPES}


@pytest.mark.parametrize("recipe", RUNS)
def test_recipe_runs_two_steps(recipe, tiny_model_path, tiny_reward_model, tmp_path):
    if recipe.stem in NEEDS:
        pytest.importorskip(NEEDS[recipe.stem])
    cfg = load_config(recipe, [f"model.name={tiny_model_path}", "engine.name=hf", f"run_dir={tmp_path}",
                               "log.progress=false", "log.tensorboard=false", "log.plot=false",
                               "rollout.prompts_per_step=4", "rollout.n=4", "rollout.max_new_tokens=6",
                               "train.steps=2", "train.eval_before=false", "train.eval_after=false",
                               "train.eval_every=0", "rollout.max_resample_rounds=1",
                               *COMPONENT_READERS.get(recipe.stem, [])])
    # a reward the tiny random model's samples differ in (the recipe's own rewards are all 0 for it), so
    # every recipe has signal to learn from; the recipe's components stay (GDPO normalises each)
    own = cfg.reward or [RewardSpec(name=task_default_reward(cfg.data)[0], options=task_default_reward(cfg.data)[1])]
    own = [RewardSpec(**{**r.model_dump(), "options": {**r.options, "path": tiny_reward_model}})
           if r.name == "reward_model" else r for r in own]
    cfg.reward = [*own, RewardSpec(name=f"{TOY}:long_text", as_name="long_text")]
    if cfg.algo.reward_combiner.options.get("constraints"):  # MORE: the tiny model meets no constraint, so every
        cfg.algo.reward_combiner.options = {**cfg.algo.reward_combiner.options, "constraints": {}}  # reward would tie
    trainer = Trainer(cfg)
    trainable = {n: p.detach().clone() for n, p in trainer.updater.model.named_parameters() if p.requires_grad}
    trained(trainer)
    rows = metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2]
    updated = [r for r in rows if not r.get("skipped") and r.get("learner/rows_skipped_frac", 0.0) < 1.0]
    assert updated, f"no step updated the policy: {rows}"
    for r in updated:
        assert math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) and r["grad_norm"] > 0
    after = dict(trainer.updater.model.named_parameters())
    assert any(not torch.equal(p, after[n]) for n, p in trainable.items()), "the weights did not change"
    saved = tmp_path / "checkpoints" / "step_000002" / "model"
    assert (saved / ("adapter_config.json" if cfg.lora.enabled else "config.json")).exists()
    if recipe.stem == "gdpo":  # each component's group-normalised advantage is logged
        assert {"adv_component/correct/mean_abs", "adv_component/number_first/mean_abs"} <= rows[-1].keys()


LENGTH_PENALISED = [r for r in RECIPES if any(s.name == "overlong_penalty" for s in load_config(r, []).reward)]


@pytest.mark.parametrize("recipe", LENGTH_PENALISED, ids=[r.stem for r in LENGTH_PENALISED])
def test_a_length_penalty_leaves_the_tasks_usual_right_reply_alone(recipe, tokenizer):
    """A recipe's length penalty must sit past the task's natural right reply ("9 * 6 = 54" and its end
    token: 9 tokens): when it does not, it fights the correctness reward (dapo.yaml with 8 new tokens
    penalised every such reply by -1 and fell back to 60.5% after learning the task)."""
    from upslope.data import load_examples
    from upslope.registry import REWARDS

    cfg = load_config(recipe, [])
    assert cfg.data.task == "arith", "extend this test with the new task's usual right reply"
    spec = next(s for s in cfg.reward if s.name == "overlong_penalty")
    penalty = REWARDS.bind(spec.name, spec.options)
    correct = REWARDS.bind(cfg.reward[0].name, cfg.reward[0].options)
    for ex in load_examples(cfg.data, "test")[:200]:
        reply = f"{ex.meta['a']} {ex.meta['op']} {ex.meta['b']} = {ex.answer}"
        tokens = len(tokenizer(reply, add_special_tokens=False)["input_ids"]) + 1  # and the end token
        assert correct(reply, ex.answer, {}) == 1.0
        meta = {"completion_tokens": tokens, "max_new_tokens": cfg.rollout.max_new_tokens}
        assert tokens <= cfg.rollout.max_new_tokens and penalty(reply, ex.answer, meta) == 0.0, (reply, tokens)
