"""The llm_judge reward with `model: policy` on the real tiny-model engines (HF, and the session's
one vLLM engine): its replies are the engine's own greedy continuations with its current weights,
one generate call per batch, cached per weights version; a query too long for the engine fails
alone (counted); with no engine in the process, one config line; and a GRPO step judged so."""
from __future__ import annotations


import pytest
import torch
from markers import VLLM_IN_PROCESS
from run_helpers import metrics

from upslope.config import RewardSpec, load_config
from upslope.engine import SamplingParams
from upslope.errors import ConfigError
from upslope.rewards import build_reward_fns, score
from upslope.rewards.context import RewardContext
from upslope.rewards.judge import judge_backend, render_query

PREFILL = "Score: 7\n"  # the tiny random model writes no grade of its own: the prefill holds one
METAS = [{"prompt": "What is 2 + 2?"}, {"prompt": "What is 3 + 3?"}]


@pytest.fixture(params=["hf_engine", pytest.param("vllm_engine", marks=VLLM_IN_PROCESS)])
def engine(request):
    return request.getfixturevalue(request.param)


def policy_judge(context: RewardContext, **options):
    """The bound llm_judge reward on the context's engine, and its judge (with its counters)."""
    [fn] = build_reward_fns([RewardSpec(name="llm_judge", options={"model": "policy", "max_new_tokens": 4,
                                                                    **options})], context=context)
    return fn.fn, judge_backend("policy", None, "default", "", "auto", 4, 16, 60.0, context)


def greedy(engine, tokenizer, queries):
    """What the engine writes after each rendered query, greedily: the judge's replies must be these."""
    ids = [tokenizer(render_query(tokenizer, q, PREFILL), add_special_tokens=False)["input_ids"] for q in queries]
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=4, stop_token_ids=[tokenizer.eos_token_id])
    return [PREFILL + c.text for [c] in engine.generate(ids, params)]


def test_policy_judge_replies_are_the_engines_greedy_ones(engine, tokenizer):
    context = RewardContext(tokenizer, lambda: engine, [tokenizer.eos_token_id])
    fn, judge = policy_judge(context, prefill=PREFILL)
    assert fn(["4", "6", "4"], [4, 6, 4], [METAS[0], METAS[1], METAS[0]]) == [0.7, 0.7, 0.7]
    assert judge.calls == 1 and judge.generated == 2  # one generate call; the third query is the first's
    (version, _, limit), _ = next(iter(judge.cache))  # (weights, prefill, reply limit: None, the judge's own)
    assert limit is None
    assert version == (id(engine), engine.version)
    assert list(judge.cache.values()) == greedy(engine, tokenizer, [q for _, q in judge.cache])
    assert fn(["6"], [6], [METAS[1]]) == [0.7] and judge.calls == 1  # from the cache


def test_policy_judge_judges_with_the_engines_current_weights(engine, tokenizer, tiny_state_dict, restore_weights):
    context = RewardContext(tokenizer, lambda: engine, [tokenizer.eos_token_id])
    fn, judge = policy_judge(context, prefill=PREFILL)
    assert fn(["6"], [6], [METAS[1]]) == [0.7]
    [(key, before)] = judge.cache.items()
    with restore_weights(engine):
        g = torch.Generator().manual_seed(0)
        engine.update_weights((k, v + 0.5 * torch.randn(v.shape, generator=g)) for k, v in tiny_state_dict.items())
        assert fn(["6"], [6], [METAS[1]]) == [0.7]
        assert judge.calls == 2 and judge.generated == 2  # new weights: the same query judged again, by them
        [(new_key, after)] = judge.cache.items()  # the old weights' replies are dropped
        assert new_key == (((id(engine), engine.version), PREFILL, None), key[1])
        assert [after] == greedy(engine, tokenizer, [key[1]]) and after != before


def test_a_query_too_long_for_the_engine_fails_alone(vllm_engine, tokenizer):
    """The session's vLLM engine takes 1024 tokens: a 1500-token completion's query is a failure
    (fallback, counted), the other sample is judged."""
    context = RewardContext(tokenizer, lambda: vllm_engine, [tokenizer.eos_token_id])
    [fn] = build_reward_fns([RewardSpec(name="llm_judge", options={"model": "policy", "prefill": PREFILL})],
                            context=context)
    result = score([fn], ["4", " word" * 1500], [4, 6], METAS, fallback=-1.0)
    assert result.components["llm_judge"] == [0.7, -1.0] and result.failures == {"llm_judge": 1}


def test_no_engine_in_the_process_is_one_config_line(tokenizer):
    spec = RewardSpec(name="llm_judge", options={"model": "policy"})
    for context in (RewardContext(tokenizer), None):  # e.g. dist.rollout_workers > 0: the engines are elsewhere
        with pytest.raises(ConfigError, match=r"^reward\[0\] \(llm_judge\): llm_judge: model=policy judges with the "
                                              r"run's own rollout engine, and there is none in this process") as err:
            build_reward_fns([spec], context=context)
        assert "\n" not in str(err.value)


@pytest.mark.slow
def test_a_grpo_step_judged_by_the_policy_engine(tiny_model_path, tmp_path):
    """One GRPO step on the tiny model rewarded by the policy judge: every sample judged by the
    trainer's own engine in one generate call, no second model loaded, no failure."""
    from upslope.train.trainers.rl import Trainer

    cfg = load_config(None, [f"model.name={tiny_model_path}", "engine.name=hf", f"run_dir={tmp_path}",
                             "log.progress=false", "log.tensorboard=false", "log.plot=false",
                             "rollout.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=4",
                             "train.eval_before=false", "train.eval_after=false", "train.steps=1", "train.threads=1",
                             'reward=[{name: llm_judge, options: {model: policy, prefill: "Score: 7\\n"}}]'])
    trainer = Trainer(cfg)
    try:
        trainer.run()
        [judge] = trainer.reward_context.state.values()
        assert judge.calls == 1 and judge.generated == len(judge.cache) >= 1  # identical samples judged once
        assert judge.context.policy_engine() is trainer.runtime.engine
    finally:
        trainer.close()
    [row] = metrics(tmp_path)
    assert row["reward/llm_judge"] == pytest.approx(0.7) and not any(k.startswith("reward_failures/") for k in row)
