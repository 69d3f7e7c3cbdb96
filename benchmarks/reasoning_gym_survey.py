"""Base pass rates of reasoning-gym generators with one model: which tasks give GRPO signal.

For each generator, `--prompts` held-out problems, `--n` samples each at temperature 1 (the training
setting) through one engine started once; reports the mean verifier score, the accuracy (score >= 0.5,
as upslope counts it; a verifier's partial credit can reach 0.5: "10" for 1), the exact share (score 1), the share of problems with at least one right sample, and the share of groups
whose rewards differ (what GRPO learns from), for the answer read from <answer> tags and from the tags or
else the number the reply ends on (extract final_number), and the mean reply length in tokens; with
`--prefill "<answer>"` the reply starts inside the tag and the answer is its first line (extract first_line).
`--instruction` replaces the task's prompt template, e.g. the step-by-step one of STEP_BY_STEP.

    python benchmarks/reasoning_gym_survey.py --out runs/rg_survey.json [--set engine.name=hf] leg_counting ...
    python benchmarks/reasoning_gym_survey.py --out runs/rg_easy.json --easy   # the smaller configs of EASY
    python benchmarks/reasoning_gym_survey.py --out runs/rg_steps.json --easy --step-by-step --max-new-tokens 128
    python benchmarks/reasoning_gym_survey.py --out runs/rg_one.json --config 'chain_sum={"max_digits": 1}'
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from upslope.config import load_config
from upslope.data import load_examples
from upslope.data.prompts import encode_prompts
from upslope.data.reasoning_gym import STEP_BY_STEP
from upslope.engine import SamplingParams
from upslope.errors import ConfigError, DataError
from upslope.rewards.reasoning_gym import extract_answer, reasoning_gym_reward
from upslope.runtime import Runtime

DEFAULT = ["basic_arithmetic", "chain_sum", "products", "leg_counting", "letter_counting", "count_bits", "gcd", "lcm",
           "number_sorting", "word_sorting", "spell_backward", "word_sequence_reversal", "base_conversion",
           "simple_equations"]

# smaller problems of the same generators, for models that get none of the defaults right; each config
# leaves room for a held-out split beside 500 training problems
EASY = {"basic_arithmetic": {"min_terms": 2, "max_terms": 2, "max_digits": 2, "operators": ["+", "-"],
                             "allow_parentheses": False, "allow_negation": False},
        "chain_sum": {"max_terms": 2, "max_digits": 2}, "products": {"max_digits": 2},
        "leg_counting": {"min_animals": 1, "max_animals": 2, "max_instances": 3},
        "letter_counting": {"min_words": 1, "max_words": 2}, "count_bits": {"max_n": 1000},
        "gcd": {"max_value": 30}, "lcm": {"max_value": 20}, "spell_backward": {"max_word_len": 4},
        "word_sorting": {"min_words": 2, "max_words": 3},
        "number_sorting": {"max_numbers": 3, "max_decimals": 0, "min_value": 0, "max_value": 50},
        "word_sequence_reversal": {"min_words": 2, "max_words": 3}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("datasets", nargs="*", help=f"generators (default: {', '.join(DEFAULT)})")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--size", type=int, default=500, help="training problems the held-out ones are kept apart from")
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--prefill", default="", help='text each reply starts with, e.g. "<answer>"')
    ap.add_argument("--easy", action="store_true", help="the generators of EASY with their smaller configs")
    ap.add_argument("--config", action="append", default=[], metavar="NAME=JSON",
                    help='a generator with its own config, e.g. --config \'chain_sum={"max_digits": 1}\' (repeatable)')
    ap.add_argument("--instruction", default=None, help="prompt template with {question} (default: the task's)")
    ap.add_argument("--step-by-step", action="store_true", help="the instruction STEP_BY_STEP: reason, then 'Answer: X'")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--set", action="append", default=[], help="a config override, e.g. --set engine.name=hf")
    a = ap.parse_args()
    extra = a.set
    instruction = STEP_BY_STEP if a.step_by_step else a.instruction
    if instruction is not None:
        extra = [f"data.options.instruction={json.dumps(instruction)}", *extra]
    named = [a.datasets or (list(EASY) if a.easy else DEFAULT)] if a.datasets or not a.config else []
    configs = {name: (EASY.get(name, {}) if a.easy else {}) for names in named for name in names}
    for item in a.config:
        name, sep, text = item.partition("=")
        try:
            configs[name] = json.loads(text) if sep else None
        except json.JSONDecodeError:
            configs[name] = None
        if not isinstance(configs[name], dict):
            ap.error(f"--config {item!r}: expected NAME=JSON object, e.g. 'chain_sum={{\"max_digits\": 1}}'")
    base = load_config(None, ["data.task=reasoning_gym", f"rollout.max_new_tokens={a.max_new_tokens}",
                              "run_dir=/tmp/rg_survey", *extra])
    runtime = Runtime.create(base)
    engine = runtime.engine
    results = {}
    for name, config in configs.items():
        cfg = load_config(None, ["data.task=reasoning_gym", f"data.options.dataset={name}", f"data.options.size={a.size}",
                                 f"data.options.config={json.dumps(config)}",
                                 f"data.options.prefill={a.prefill!r}",
                                 f"rollout.max_new_tokens={a.max_new_tokens}", "run_dir=/tmp/rg_survey", *extra])
        try:
            examples = load_examples(cfg.data.model_copy(update={"split": "test"}), "test")[:a.prompts]
        except (ConfigError, DataError) as exc:  # e.g. a config too small for a held-out split beside --size
            results[name] = {"config": config, "skipped": str(exc)}
            print(name, "skipped:", exc, flush=True)
            continue
        ids, kept = encode_prompts(examples, runtime.tokenizer)
        examples = [examples[i] for i in kept]
        start = time.perf_counter()
        outs = engine.generate(ids, SamplingParams(n=a.n, temperature=1.0, max_new_tokens=a.max_new_tokens, seed=0,
                                                   stop_token_ids=runtime.stop_ids))
        seconds = time.perf_counter() - start
        row = {"seconds": round(seconds, 1), "prompts": len(examples), "config": config}
        for extract in (("first_line", "whole") if a.prefill else ("tag", "final_number")):
            scores = [[reasoning_gym_reward(c.text, ex.answer, ex.meta, extract=extract) for c in group]
                      for ex, group in zip(examples, outs)]
            flat = [s for g in scores for s in g]
            row[extract] = {"score": round(statistics.fmean(flat), 3),
                            "accuracy": round(statistics.fmean(s >= 0.5 for s in flat), 3),
                            "exact": round(statistics.fmean(s == 1.0 for s in flat), 3),
                            "pass_at_n": round(statistics.fmean(any(s >= 0.5 for s in g) for g in scores), 3),
                            "groups_with_signal": round(statistics.fmean(len(set(g)) > 1 for g in scores), 3)}
        row["reply_tokens"] = round(statistics.fmean(len(c.token_ids) for g in outs for c in g), 1)
        row["truncated"] = round(statistics.fmean(c.truncated for g in outs for c in g), 3)
        row["tagged"] = round(statistics.fmean(extract_answer(c.text, "tag") is not None for g in outs for c in g), 3)
        row["example"] = {"prompt": examples[0].prompt, "answer": examples[0].answer, "completion": outs[0][0].text}
        results[name] = row
        print(name, json.dumps({k: v for k, v in row.items() if k != "example"}), flush=True)
        a.out.write_text(json.dumps(results, indent=2))
    runtime.close()


if __name__ == "__main__":
    main()
