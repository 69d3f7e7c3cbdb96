"""Learned rewards on real parts: the reward_model reward (scores equal to HF's class on the
same text, normalisation by hand, the one-line tokenizer-mismatch error from the CLI), the
llm_judge's score parser on malformed replies and a local judge model (failures counted,
identical queries answered once), and the process reward's step splitting and aggregation."""
from __future__ import annotations

import math
import shutil

import pytest
import torch
from run_helpers import metrics, trained

from upslope.cli import main
from upslope.config import RewardSpec
from upslope.errors import ConfigError
from upslope.rewards import build_reward_fns, score
from upslope.rewards.context import RewardContext
from upslope.rewards.judge import judge_backend, parse_score
from upslope.rewards.process import aggregate_steps, split_steps
from upslope.rewards.reward_model import RunningStats, normalize_scores
from upslope.scalar_head import load_scalar_model


@pytest.fixture(scope="module")
def reward_model_dir(tiny_model_path, tokenizer, tmp_path_factory) -> str:
    """A reward model on the tiny model with a non-zero head (as `upslope rm` saves it)."""
    out = tmp_path_factory.mktemp("rm") / "model"
    model = load_scalar_model(tiny_model_path, pad_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    torch.nn.init.normal_(model.net.score.weight, std=1.0)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


# ------------------------------------------------------------------ reward_model

def test_reward_model_scores_are_hf_sequence_classification_scores(reward_model_dir, tokenizer):
    """The reward is what AutoModelForSequenceClassification gives for prompt (chat template) + reply + end token."""
    from transformers import AutoModelForSequenceClassification

    [fn] = build_reward_fns([RewardSpec(name="reward_model", options={"path": reward_model_dir})],
                            context=RewardContext(policy_tokenizer=tokenizer))
    prompts = ["What is 2 + 2?", [{"role": "user", "content": "Name a colour."}]]
    replies = ["4", "Blue, I think."]
    got = fn.fn(replies, [None, None], [{"prompt": p} for p in prompts])
    hf = AutoModelForSequenceClassification.from_pretrained(reward_model_dir).eval()
    want = []
    for p, r in zip(prompts, replies):
        msgs = [{"role": "user", "content": p}] if isinstance(p, str) else p
        text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) + r
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        with torch.no_grad():
            want.append(float(hf(input_ids=torch.tensor([ids])).logits[0, 0]))
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert got[0] != got[1]
    # keep_states: each sample's meta gets the hidden state the head read (the score is the head on it)
    [kept] = build_reward_fns([RewardSpec(name="reward_model", options={"path": reward_model_dir, "keep_states": True})],
                              context=RewardContext(policy_tokenizer=tokenizer))
    metas = [{"prompt": p} for p in prompts]
    assert kept.fn(replies, [None, None], metas) == pytest.approx(got, rel=1e-6)
    head = hf.score.weight[0].detach()
    for m, value in zip(metas, got):
        assert m["reward_model_state"].shape == (hf.config.hidden_size,)
        assert float(m["reward_model_state"] @ head) == pytest.approx(value, rel=1e-5, abs=1e-6)


def test_normalisation_by_hand():
    assert normalize_scores([1.0, 3.0], "none") == [1.0, 3.0]
    assert normalize_scores([1.0, 3.0], "batch", eps=0.0) == [-1.0, 1.0]  # mean 2, std 1
    stats = RunningStats()
    assert normalize_scores([0.0, 2.0], "running", stats, eps=0.0) == [-1.0, 1.0]
    # after [0, 2, 4, 6]: mean 3, population std sqrt(5)
    got = normalize_scores([4.0, 6.0], "running", stats, eps=0.0)
    assert got == pytest.approx([1 / math.sqrt(5), 3 / math.sqrt(5)])
    assert stats.count == 4 and stats.mean == 3.0


def test_reward_model_without_prompts_is_one_clear_error(reward_model_dir):
    [fn] = build_reward_fns([RewardSpec(name="reward_model", options={"path": reward_model_dir})])
    result = score([fn], ["4"], [None], [{}])
    assert result.failures == {"reward_model": 1} and "no prompt" in result.errors["reward_model"]


def test_tokenizer_mismatch_is_one_line_exit_2(reward_model_dir, tiny_model_path, tmp_path, capsys):
    """A policy whose tokenizer has one more token than the reward model's: `upslope train` stops at
    once with one line naming the reward and the difference."""
    from transformers import AutoTokenizer

    policy = tmp_path / "policy"
    shutil.copytree(tiny_model_path, policy)
    tok = AutoTokenizer.from_pretrained(policy)
    tok.add_tokens(["<extra_token_for_the_test>"])
    tok.save_pretrained(policy)
    code = main(["train", f"model.name={policy}", "engine.name=hf", f"run_dir={tmp_path / 'run'}",
                 "log.progress=false", f"reward=[{{name: reward_model, options: {{path: '{reward_model_dir}'}}}}]"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "reward[0] (reward_model)" in err and "tokenizer differs from the policy's" in err
    assert "<extra_token_for_the_test>" in err


def test_reward_model_drives_training_end_to_end(reward_model_dir, tiny_model_path, tmp_path):
    """GraphAE (GRPO propagated over edges from the reward model's hidden states, which the reward keeps on each
    sample) on the tiny model with the learned reward: every completion is scored (no failure)."""
    from upslope.config import load_config
    from upslope.train.trainers.rl import Trainer

    run = tmp_path / "grpo_rm"
    cfg = load_config(None, [f"model.name={tiny_model_path}", "engine.name=hf", f"run_dir={run}", "log.progress=false",
                             "log.tensorboard=false", "log.plot=false", "rollout.prompts_per_step=2", "rollout.n=2",
                             "rollout.max_new_tokens=4", "train.eval_before=false", "train.eval_after=false",
                             "train.steps=1", "train.threads=1", "train.micro_batch_tokens=512",
                             "algo.advantage.name=graphae", "algo.advantage.options.edges=reward_model",
                             f"reward=[{{name: reward_model, options: {{path: '{reward_model_dir}', keep_states: true}}}}]"])
    trained(Trainer(cfg))
    [row] = metrics(run)
    assert not any(k.startswith("reward_failures/") for k in row)
    assert row["reward/mean"] != 0.0  # neither the fallback (0) nor a zero head: the model's scores


# ------------------------------------------------------------------ llm_judge

@pytest.mark.parametrize("reply, grade", [
    ("Score: 7", 0.7),
    ("The answer is wrong.\nScore: 0", 0.0),
    ("**Score:** 10", 1.0),
    ("score = 8.5", 0.85),
    ("I'd give it 6/10.", 0.6),
    ("3 out of 5", 0.6),
    (" 9 ", 0.9),
    ("Score: 4\nOn reflection, Score: 5", 0.5),  # the last score counts
    ("Score: 11", None),  # over the scale
    ("Score: -1", None),  # under it
    ("", None),
    ("The response is great!", None),
    ("Score: seven", None),
    ("2 + 2 = 4, so yes", None),
    ("1/0", None),
])
def test_judge_parser_on_malformed_replies(reply, grade):
    got = parse_score(reply, 10.0)
    assert got == (None if grade is None else pytest.approx(grade))


def test_local_judge_counts_failures_and_answers_identical_queries_once(tiny_model_path):
    """The tiny random model writes no grade: every sample fails (fallback, counted). With a
    prefill that already holds the grade every sample parses; a repeated query costs no generation."""
    def spec(**o):
        return RewardSpec(name="llm_judge", options={"model": tiny_model_path, "max_new_tokens": 4, **o})

    metas = [{"prompt": "What is 2 + 2?"}, {"prompt": "What is 3 + 3?"}]
    [fn] = build_reward_fns([spec(prefill="")])
    result = score([fn], ["4", "6"], [4, 6], metas, fallback=-1.0)
    assert result.failures == {"llm_judge": 2} and result.components["llm_judge"] == [-1.0, -1.0]

    [fn] = build_reward_fns([spec(prefill="Score: 7\n")])
    judge = judge_backend(tiny_model_path, None, "default", "OPENAI_API_KEY", "auto", 4, 16, 60.0)
    before = judge.generated
    assert fn.fn(["4", "6", "4"], [4, 6, 4], [metas[0], metas[1], metas[0]]) == [0.7, 0.7, 0.7]
    assert judge.generated - before == 2  # the third query is the first's
    assert fn.fn(["6"], [6], [metas[1]]) == [0.7] and judge.generated - before == 2
    assert len(judge.cache) >= 4  # both prefills' queries


def test_judge_needs_exactly_one_backend():
    """Neither a model nor a URL: one config line when the rewards are built (the run has not started)."""
    with pytest.raises(ConfigError, match=r"^reward\[0\] \(llm_judge\): llm_judge: give exactly one of options"):
        build_reward_fns([RewardSpec(name="llm_judge", options={})])


# ------------------------------------------------------------------ process

def test_split_steps_by_hand():
    assert split_steps("a\nb\n\nc", "\n") == ["a\n", "b\n", "c"]
    assert split_steps("Step 1: x Step 2: y", "Step") == ["Step", " 1: x Step", " 2: y"]
    assert split_steps("no delimiter", "\n") == ["no delimiter"]
    assert split_steps("", "\n") == [""]
    assert "".join(split_steps("x\ny\n", "\n")) == "x\ny\n"


def test_aggregate_steps_by_hand():
    s = [0.5, 1.0, 0.0, 0.75]
    assert aggregate_steps(s, "min") == 0.0
    assert aggregate_steps(s, "mean") == pytest.approx(2.25 / 4)
    assert aggregate_steps(s, "last") == 0.75
    assert math.isnan(aggregate_steps([], "min"))


@pytest.mark.parametrize("prefix, how, want", [
    (False, "min", [0.0, 1.0]), (False, "mean", [2 / 3, 1.0]), (False, "last", [1.0, 1.0]),
    (True, "min", [1.0, 1.0]),  # every prefix contains the first step's "ok"
])
def test_process_reward_scores_each_step_with_a_real_reward(prefix, how, want):
    """Step reward `format` (does the step contain 'ok'?) on 'ok / bad / ok' and on one 'ok' step."""
    [fn] = build_reward_fns([RewardSpec(name="process", options={
        "step_reward": "format", "step_options": {"pattern": "ok"}, "aggregate": how, "prefix": prefix})])
    assert fn.fn(["ok\nbad\nok", "ok fine"], [None, None], [{}, {}]) == pytest.approx(want)


def test_process_reward_fails_a_sample_whose_step_fails():
    [fn] = build_reward_fns([RewardSpec(name="process", options={"step_reward": "integer"})])
    result = score([fn], ["12\n13", "x"], ["13", "oops"], [{}, {}], fallback=-1.0)
    assert result.components["process"] == [0.0, -1.0] and result.failures == {"process": 1}
