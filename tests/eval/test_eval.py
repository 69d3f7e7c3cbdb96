"""`upslope.eval.runner.evaluate` end to end on the tiny model with the HF engine: the
summary's metrics recomputed by hand from the samples it writes."""
from __future__ import annotations

import json
import textwrap
from collections import Counter
from math import comb
from statistics import mean

import pytest

from upslope.cli import main
from upslope.config import RewardSpec, load_config
from upslope.errors import ConfigError
from upslope.eval.runner import answer_key, evaluate
from upslope.runtime import Runtime

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def run_eval(tiny_model_path, tmp_path, *overrides: str):
    cfg = load_config(None, ["engine.name=hf", f"model.name={tiny_model_path}", "eval.limit=8", "eval.n=4",
                             "eval.k=[1,4]", "eval.temperature=1", "rollout.max_new_tokens=8",
                             f"run_dir={tmp_path}", *overrides])
    runtime = Runtime.create(cfg, announce=lambda m: None)
    try:
        summary = evaluate(runtime, out_dir=tmp_path, show_progress=False)
    finally:
        runtime.close()
    samples = [json.loads(line) for line in (tmp_path / "eval_samples.jsonl").read_text().splitlines()]
    return cfg, summary, samples


def test_evaluate_arith_summary_and_samples(tiny_model_path, tmp_path):
    cfg, summary, samples = run_eval(tiny_model_path, tmp_path)
    for key in ("accuracy", "pass@1", "pass@4", "maj@4", "mean_length", "mean_reward", "truncated_frac"):
        assert key in summary, key
    assert "maj@1" not in summary
    assert summary["prompts"] == 8 and summary["samples"] == 32 and len(samples) == 32
    assert summary["engine"] == "hf" and summary["n"] == 4 and summary["temperature"] == 1.0
    assert json.loads((tmp_path / "eval_summary.json").read_text()) == summary
    # samples come from the arith test split, 4 per prompt in order, scored by the task's reward
    ids = [s["id"] for s in samples]
    assert ids == [f"arith-test-{i // 4}" for i in range(32)]
    for s in samples:
        assert s["reward"] == s["reward/integer"] and s["correct"] == (s["reward"] >= 0.5)
        assert 1 <= s["tokens"] <= 8 and s["finish"] in ("stop", "length")
    assert summary["mean_length"] == pytest.approx(mean(s["tokens"] for s in samples), abs=0.01)
    assert summary["accuracy"] == pytest.approx(mean(s["correct"] for s in samples), abs=1e-4)
    assert summary["pass@1"] == pytest.approx(summary["accuracy"], abs=1e-4)
    assert summary["truncated_frac"] == pytest.approx(mean(s["finish"] == "length" for s in samples), abs=1e-4)


USER_REWARD = """
def even_length(completion, answer, meta):
    return float(len(completion) % 2 == 0)
"""


def hand_pass_at_k(n: int, c: int, k: int) -> float:
    return 1.0 - comb(n - c, k) / comb(n, k)


def test_evaluate_metrics_recomputed_from_samples(tiny_model_path, tmp_path):
    """A reward that is right about half the time, so pass@k and maj@k are not trivially 0."""
    reward_file = tmp_path / "r.py"
    reward_file.write_text(textwrap.dedent(USER_REWARD))
    _, summary, samples = run_eval(tiny_model_path, tmp_path, f"reward=[{{name: '{reward_file}:even_length'}}]")
    assert len(samples) == 32
    groups = [samples[i:i + 4] for i in range(0, 32, 4)]
    correct = [[s["correct"] for s in g] for g in groups]
    assert 0 < sum(map(sum, correct)) < 32  # the check below is not vacuous
    assert summary["accuracy"] == pytest.approx(mean(c for g in correct for c in g), abs=1e-4)
    for k in (1, 4):
        expected = mean(hand_pass_at_k(4, sum(g), k) for g in correct)
        assert summary[f"pass@{k}"] == pytest.approx(expected, abs=1e-4)
    # maj@4: vote on the stripped completion text (no box, no '####'), ties to the first seen
    maj = []
    for g in groups:
        votes = [(s["completion"].strip(), s["correct"]) for s in g if s["completion"].strip()]
        if not votes:
            maj.append(0.0)
            continue
        counts = Counter(v for v, _ in votes)
        winner = next(v for v, _ in votes if counts[v] == max(counts.values()))
        maj.append(float(any(ok for v, ok in votes if v == winner)))
    assert summary["maj@4"] == pytest.approx(mean(maj), abs=1e-4)
    assert summary["reward_failures"] == {}


def test_evaluate_greedy_with_several_samples(tiny_model_path, tmp_path):
    """Greedy with n=2: both samples are identical, so pass@1 = pass@2 = maj@2 = accuracy."""
    _, summary, samples = run_eval(tiny_model_path, tmp_path, "eval.temperature=0", "eval.n=2", "eval.k=[1,2]",
                                   "eval.limit=3", "reward=[{name: format, options: {pattern: '[aeiou]'}}]")
    assert len(samples) == 6
    for a, b in zip(samples[::2], samples[1::2]):
        assert a["completion"] == b["completion"] and a["correct"] == b["correct"]
    assert summary["pass@1"] == summary["pass@2"] == summary["maj@2"] == summary["accuracy"]


def test_evaluate_rejects_k_above_n(tiny_model_path, tmp_path):
    with pytest.raises(ConfigError, match=r"eval.k: \[8\] not in 1..eval.n=4"):
        run_eval(tiny_model_path, tmp_path, "eval.k=[1,8]")


def test_answer_key():
    integer = RewardSpec(name="integer", options={"extract": "last"})
    assert answer_key("it is 3, no 1,200", integer) == "1200"
    assert answer_key("no digits", integer) is None
    assert answer_key("so \\boxed{ x+1 } done", RewardSpec(name="math")) == "x+1"
    assert answer_key("work\n#### 42 ", RewardSpec(name="math")) == "42"
    assert answer_key("  plain  ", None) == "plain" and answer_key("   ", None) is None


def test_cli_eval_writes_summary(tiny_model_path, tmp_path, capsys):
    rc = main(["eval", f"model.name={tiny_model_path}", "engine.name=hf", "eval.limit=2", "eval.n=2",
               "eval.k=[1,2]", "eval.temperature=1", "rollout.max_new_tokens=4", "log.progress=false",
               f"run_dir={tmp_path}"])
    assert rc == 0
    summary = json.loads((tmp_path / "eval_summary.json").read_text())
    assert summary["prompts"] == 2 and summary["samples"] == 4 and "pass@2" in summary
    out = capsys.readouterr().out
    assert json.dumps(summary) in out  # the summary is also printed as one JSON line


@pytest.mark.parametrize("shaping", [
    "rollout.kind=tree rollout.options={branches: 2, depths: [1, 2]}",
    "rollout.kind=denoise rollout.options={share: 1.0, prefix_frac: 0.5, noise: 1.0}",
    "rollout.kind=espo rollout.options={margin: 0.0, min_tokens: 1}",
], ids=["tree", "denoise", "espo"])
def test_a_training_time_rollout_shaping_leaves_evaluation_plain(shaping, tiny_model_path, tmp_path):
    """Tree branching, noisy prefixes and early stops shape the training samples only: the held-out
    evaluation of such a run samples plainly, so its samples are those of a single_turn run (greedy, same
    seed). Before, a tree recipe's final evaluation (eval.n=1) failed and denoise scored corrupted prefixes."""
    greedy = ("eval.temperature=0", "eval.n=1", "eval.k=[1]", "eval.limit=4")
    _, plain, plain_samples = run_eval(tiny_model_path, tmp_path / "plain", *greedy)
    _, shaped, shaped_samples = run_eval(tiny_model_path, tmp_path / "shaped", *greedy, *shaping.split(" ", 1))
    assert [s["completion"] for s in shaped_samples] == [s["completion"] for s in plain_samples]
    assert shaped["accuracy"] == plain["accuracy"] and not any(k.startswith(("espo/", "tree/", "denoise/"))
                                                                for k in shaped)


def test_evaluation_gives_no_guidance_after_a_wrong_answer(tiny_model_path, tmp_path):
    """A SocraticPO run's teacher diagnoses a wrong answer and asks again: help at training time only. Its
    held-out evaluation scores the first answer unaided (the transcript after the prompt is one model turn, with no guidance), where
    before a guided second answer counted as correct."""
    socratic = ("rollout.kind=multi_turn", "rollout.max_new_tokens=128", "agent.max_turns=2", "agent.max_turn_tokens=8",
                "agent.env={name: socratic, options: {hints: 1}}", "reward=[{name: env, options: {part: correct}}]",
                "eval.temperature=0", "eval.n=1", "eval.k=[1]", "eval.limit=6")
    _, summary, samples = run_eval(tiny_model_path, tmp_path, *socratic)
    assert sum(not s["correct"] for s in samples) > 0  # wrong answers the teacher would have guided
    for s in samples:
        assert "is not right" not in s["transcript"] and "<|im_start|>" not in s["transcript"]  # no second turn
    assert summary["accuracy"] == mean(s["correct"] for s in samples)


def test_a_run_on_one_training_file_says_its_evaluation_is_not_held_out(tiny_model_path, tmp_path, capsys):
    """Without eval.data, a single-file source is evaluated on that file: the run says so once (its
    'held-out accuracy' is on training prompts); with eval.data set it does not."""
    from upslope.cli import main

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {i} + 1?", "answer": i + 1}) + "\n" for i in range(4)))
    base = ["train", f"model.name={tiny_model_path}", "engine.name=hf", f"data.path={data}", "reward=[{name: integer}]",
            "train.steps=1", "train.eval_before=false", "eval.limit=2", "rollout.prompts_per_step=2", "rollout.n=2",
            "rollout.max_new_tokens=8"]
    warning = "evaluation reads the training file"
    for extra, expected in (([], 1), ([f"eval.data.path={data}"], 0)):
        assert main([*base, f"run_dir={tmp_path / f'r{expected}'}", *extra]) == 0
        out = capsys.readouterr()
        assert " ".join((out.out + out.err).split()).count(warning) == expected


def test_eval_data_as_a_path_reads_records_as_the_training_data_does(tiny_model_path, tmp_path):
    """`eval.data=FILE` is the path; the records are read with the training source's field mapping
    (here chats under `conv`, answers under `sol`, a system prompt) unless eval.data sets its own."""
    rows = [{"conv": [{"role": "user", "content": f"What is {i} + 1?"}], "sol": i + 1} for i in range(3)]
    test = tmp_path / "test.jsonl"
    test.write_text("".join(json.dumps(r) + "\n" for r in rows))
    mapping = ["data.messages_field=conv", "data.answer_field=sol", "data.system_prompt=Answer with a number.",
               "reward=[{name: integer}]"]
    cfg, summary, samples = run_eval(tiny_model_path, tmp_path / "a", f"eval.data={test}", "eval.n=1", "eval.k=[1]",
                                     *mapping)
    assert cfg.eval.data.path == str(test) and cfg.eval.data.messages_field == "conv"
    assert summary["prompts"] == 3 and [s["answer"] for s in samples] == [1, 2, 3]
    assert samples[0]["prompt"][0] == {"role": "user", "content": "What is 0 + 1?"}
    # what eval.data sets wins over the training mapping; the file has no `answer` field: one line naming it
    with pytest.raises(Exception, match="field 'answer' missing \\(eval.data.answer_field"):
        run_eval(tiny_model_path, tmp_path / "b", f"eval.data={{path: {test}, answer_field: answer}}", *mapping)


def test_eval_data_path_in_a_recipe(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("data: {path: train.jsonl, prompt_field: question}\neval: {data: test.jsonl}\n")
    cfg = load_config(recipe)
    assert cfg.eval.data.path == "test.jsonl" and cfg.eval.data.prompt_field == "question"
    assert cfg.eval.data.task == "arith" and cfg.eval.data.limit is None  # only the mapping is inherited
