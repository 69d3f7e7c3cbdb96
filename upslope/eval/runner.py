"""`upslope eval`: sample, score, and report accuracy, pass@k, maj@k and lengths."""
from __future__ import annotations

import json
import time
from pathlib import Path
from statistics import mean
from typing import Any, Sequence

from upslope.config import Config, DataConfig, RewardSpec, task_generation_length
from upslope.data import load_examples
from upslope.data.prompts import encode_prompts
from upslope.data.types import Example
from upslope.errors import ConfigError
from upslope.eval.metrics import maj_at_k, pass_at_k
from upslope.logs.progress import progress_bar
from upslope.registry import REWARD_COMBINERS
from upslope.rewards import build_reward_fns, combined, score, status_counts
from upslope.rewards.extract import boxed, extract_integer
from upslope.rollout.base import SamplingParams
from upslope.runtime import Runtime


def eval_data_config(cfg: Config) -> DataConfig:
    """The held-out data: eval.data, or the training source's test split."""
    if cfg.eval.data is not None:
        return cfg.eval.data
    return cfg.data.model_copy(update={"split": "test", "limit": None})


def answer_key(completion: str, spec: RewardSpec | None) -> str | None:
    """What a sample 'answers', for majority voting, in the way its reward reads it."""
    if spec is not None and spec.name == "integer":
        got = extract_integer(completion, spec.options.get("extract", "first"))
        return None if got is None else str(got)
    inner = boxed(completion)
    if inner is not None:
        return inner.strip()
    if "####" in completion:
        return completion.rsplit("####", 1)[1].strip()
    return completion.strip() or None


def evaluate(runtime: Runtime, examples: Sequence[Example] | None = None, out_dir: str | Path | None = None,
             show_progress: bool = True, tag: str = "eval") -> dict[str, Any]:
    """Evaluate the engine's current weights; returns the summary (also written as JSON)."""
    cfg = runtime.cfg
    ev = cfg.eval
    data_cfg = eval_data_config(cfg)
    if examples is None:
        examples = load_examples(data_cfg, default_split="test")
    if ev.limit:
        examples = list(examples)[: ev.limit]
    bad_k = [k for k in ev.k if k > ev.n or k < 1]
    if bad_k:
        raise ConfigError(f"eval.k: {bad_k} not in 1..eval.n={ev.n} (sample more with eval.n=...)")
    prompt_ids, kept = encode_prompts(examples, runtime.tokenizer, system_prompt=data_cfg.system_prompt,
                                      use_chat_template=cfg.model.use_chat_template,
                                      max_prompt_tokens=cfg.rollout.max_prompt_tokens,
                                      drop_long=cfg.rollout.drop_long_prompts)
    examples = [examples[i] for i in kept]
    specs = list(cfg.reward)
    reward_fns = build_reward_fns(specs, data_cfg)
    if not specs:
        from upslope.data import task_default_reward

        name, opts = task_default_reward(data_cfg)  # type: ignore[misc]
        specs = [RewardSpec(name=name, options=opts)]
    params = SamplingParams(n=ev.n, temperature=ev.temperature, top_p=ev.top_p,
                            max_new_tokens=ev.max_new_tokens or (task_generation_length(data_cfg) if ev.data
                                                                 else cfg.rollout.max_new_tokens),
                            seed=cfg.train.seed, stop_token_ids=runtime.stop_ids)
    engine = runtime.engine
    completions = []
    chunk = max(1, 256 // ev.n)
    t0 = time.perf_counter()
    tokens = 0
    with progress_bar(f"{tag}: generating", len(prompt_ids), enabled=show_progress) as bar:
        for start in range(0, len(prompt_ids), chunk):
            out = engine.generate(prompt_ids[start:start + chunk], params)
            completions.extend(out)
            tokens += sum(len(c.token_ids) for group in out for c in group)
            bar.advance(len(out), tokens_per_s=tokens / max(time.perf_counter() - t0, 1e-9))
    gen_s = time.perf_counter() - t0
    flat = [c for group in completions for c in group]
    answers = [ex.answer for ex in examples for _ in range(ev.n)]
    metas = [dict(ex.meta) for ex in examples for _ in range(ev.n)]
    result = score(reward_fns, [c.text for c in flat], answers, metas, cfg.reward_fallback)
    combiner = REWARD_COMBINERS.bind(cfg.algo.reward_combiner.name, cfg.algo.reward_combiner.options,
                                     where="algo.reward_combiner.options")
    rewards = combined(result, [i // ev.n for i in range(len(flat))], combiner)
    first = next(iter(result.components))
    correct = [v >= 0.5 for v in result.components[first]]
    summary = _summarise(examples, flat, rewards, correct, specs[0], ev.n, ev.k)
    statuses = status_counts(metas)
    if statuses:
        summary["sandbox_status"] = statuses
    summary.update(tag=tag, engine=engine.name, gen_seconds=round(gen_s, 2),
                   tokens_per_s=round(tokens / max(gen_s, 1e-9), 1), reward_failures=result.failures,
                   temperature=ev.temperature, n=ev.n)
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{tag}_summary.json").write_text(json.dumps(summary, indent=2))
        if ev.write_samples:
            with open(out / f"{tag}_samples.jsonl", "w") as fh:
                for i, c in enumerate(flat):
                    ex = examples[i // ev.n]
                    fh.write(json.dumps({"id": ex.id, "prompt": ex.prompt, "answer": ex.answer, "completion": c.text,
                                         "reward": rewards[i], "correct": correct[i], "finish": c.finish_reason,
                                         "tokens": len(c.token_ids), "status": metas[i].get("sandbox_status"),
                                         **{f"reward/{k}": v[i] for k, v in result.components.items()}},
                                        default=str) + "\n")
    return summary


def _summarise(examples: Sequence[Example], flat: list, rewards: list[float], correct: list[bool],
               spec: RewardSpec, n: int, ks: Sequence[int]) -> dict[str, Any]:
    lens = [len(c.token_ids) for c in flat]
    out: dict[str, Any] = {
        "prompts": len(examples),
        "samples": len(flat),
        "accuracy": round(mean(correct), 4) if correct else 0.0,
        "mean_reward": round(mean(rewards), 4) if rewards else 0.0,
        "mean_length": round(mean(lens), 2) if lens else 0.0,
        "truncated_frac": round(mean(c.truncated for c in flat), 4) if flat else 0.0,
    }
    for k in ks:
        per_prompt_pass, per_prompt_maj = [], []
        for p in range(len(examples)):
            ok = correct[p * n:(p + 1) * n]
            keys = [answer_key(c.text, spec) for c in flat[p * n:(p + 1) * n]]
            per_prompt_pass.append(pass_at_k(n, sum(ok), k))
            per_prompt_maj.append(maj_at_k(keys, ok, k))
        out[f"pass@{k}"] = round(mean(per_prompt_pass), 4)
        if k > 1:
            out[f"maj@{k}"] = round(mean(per_prompt_maj), 4)
    return out
