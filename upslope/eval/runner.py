"""`upslope eval`: sample, score, and report accuracy, pass@k, maj@k, lengths and (when asked) calibration
and selective-prediction statistics."""
from __future__ import annotations

import json
from pathlib import Path
from statistics import mean
from typing import Any, Sequence

from upslope.batch import Batch, concat
from upslope.config import Config, DataConfig, RewardSpec, eval_generation_length
from upslope.data import has_split, load_examples
from upslope.data.prompts import encode_prompts
from upslope.data.types import Example
from upslope.errors import ConfigError
from upslope.algos.confidence import sequence_confidence
from upslope.eval.calibration import calibration_summary, selective_summary
from upslope.eval.metrics import maj_at_k, pass_at_k
from upslope.logs.progress import progress_bar
from upslope.registry import REWARD_COMBINERS
from upslope.rewards import build_reward_fns, check_rewards, status_counts
from upslope.rewards.extract import boxed, extract_integer
from upslope.engine import SamplingParams
from upslope.runtime import Runtime
from upslope.rollout.plugin import make_rollout
from upslope.train.collect import Rounds, Task, collect, on_engine
from upslope.train.stages import meta_metrics
from upslope.train.timing import StageClock


def eval_data_config(cfg: Config) -> DataConfig:
    """The held-out data: eval.data, or the training source's test split."""
    if cfg.eval.data is not None:
        return cfg.eval.data
    split = "test" if has_split(cfg.data, "test") else cfg.data.split  # else the training data (reported)
    return cfg.data.model_copy(update={"split": split, "limit": None})


def load_eval_examples(cfg: Config) -> list[Example]:
    """The held-out examples (eval_data_config); errors name eval.data's options when it is set."""
    return load_examples(eval_data_config(cfg), "test", "eval.data" if cfg.eval.data is not None else "data")


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
        examples = load_eval_examples(cfg)
    if ev.limit:
        examples = list(examples)[: ev.limit]
    bad_k = [k for k in ev.k if k > ev.n or k < 1]
    if bad_k:
        raise ConfigError(f"eval.k: {bad_k} not in 1..eval.n={ev.n} (sample more with eval.n=...)")
    prompt_ids, kept = encode_prompts(examples, runtime.tokenizer, system_prompt=data_cfg.system_prompt,
                                      use_chat_template=cfg.model.use_chat_template,
                                      max_prompt_tokens=cfg.rollout.max_prompt_tokens,
                                      drop_long=cfg.rollout.drop_long_prompts,
                                      max_new_tokens=eval_generation_length(cfg),
                                      new_tokens_option="eval.max_new_tokens" if ev.max_new_tokens or ev.data
                                      else "rollout.max_new_tokens")
    examples = [examples[i] for i in kept]
    specs = list(cfg.reward)
    reward_fns = build_reward_fns(specs, data_cfg, runtime.reward_context())
    check_rewards(reward_fns, examples)
    if not specs:
        from upslope.data import task_default_reward

        name, opts = task_default_reward(data_cfg)  # type: ignore[misc]
        specs = [RewardSpec(name=name, options=opts)]
    params = SamplingParams(n=ev.n, temperature=ev.temperature, top_p=ev.top_p,
                            max_new_tokens=eval_generation_length(cfg),
                            seed=cfg.train.seed ^ cfg.engine.seed, stop_token_ids=runtime.stop_ids)
    combiner = REWARD_COMBINERS.bind(cfg.algo.reward_combiner.name, cfg.algo.reward_combiner.options,
                                     where="algo.reward_combiner.options")
    pad_id = runtime.tokenizer.pad_token_id
    task = Task(prompt_ids, list(examples), reward_fns, combiner, cfg.reward_fallback, pad_id=pad_id,
                strict_rewards=False)
    plugin = make_rollout(cfg, runtime.tokenizer, evaluation=True)
    engine = runtime.engine
    rollout = on_engine(engine, plugin, pad_id)
    clock = StageClock()
    batches: list[Batch] = []
    chunk_metrics: list[dict[str, Any]] = []
    chunk = max(1, 256 // ev.n)
    tokens = 0
    with progress_bar(f"{tag}: generating", len(prompt_ids), enabled=show_progress) as bar:
        for start in range(0, len(prompt_ids), chunk):
            part = list(range(start, min(start + chunk, len(prompt_ids))))
            got = collect(task, rollout, lambda _: part, params, Rounds(want=len(part)), clock=clock)
            batches.append(got.batch)
            chunk_metrics.append(got.metrics)
            tokens += int(got.batch.completion_lens.sum())
            bar.advance(len(part), tokens_per_s=tokens / max(clock.seconds.get("rollout", 0.0), 1e-9))
    gen_s = clock.seconds.get("rollout", 0.0)
    batch = concat(batches, pad_id)
    metas = batch.meta
    rewards = batch.rewards.tolist() if batch.rewards is not None else []
    first = next(iter(batch.reward_components))
    correct = [v >= 0.5 for v in batch.reward_components[first].tolist()]
    failures: dict[str, int] = {}
    for got_metrics in chunk_metrics:
        for key, count in got_metrics.items():
            if key.startswith("reward_failures/"):
                name = key.removeprefix("reward_failures/")
                failures[name] = failures.get(name, 0) + int(count)
    summary = _summarise(examples, metas, rewards, correct, specs[0], ev.n, ev.k)
    completions = [m["completion"] for m in metas]
    if ev.confidence_pattern:
        summary.update(calibration_summary(completions, correct, ev.confidence_pattern))
    if ev.abstain_pattern:
        scores = sequence_confidence(batch).tolist()
        summary.update(selective_summary(completions, correct, scores, ev.abstain_pattern))
    summary.update(meta_metrics(metas))
    statuses = status_counts(metas)
    if statuses:
        summary["sandbox_status"] = statuses
    summary.update(tag=tag, engine=engine.name, gen_seconds=round(gen_s, 2),
                   tokens_per_s=round(tokens / max(gen_s, 1e-9), 1), reward_failures=failures,
                   temperature=ev.temperature, n=ev.n)
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{tag}_summary.json").write_text(json.dumps(summary, indent=2))
        if ev.write_samples:
            with open(out / f"{tag}_samples.jsonl", "w") as fh:
                for i, m in enumerate(metas):
                    ex = examples[i // ev.n]
                    fh.write(json.dumps({"id": ex.id, "prompt": ex.prompt, "answer": ex.answer,
                                         "completion": m["completion"], "reward": rewards[i], "correct": correct[i],
                                         "finish": m["finish_reason"], "tokens": m["completion_tokens"],
                                         "status": m.get("sandbox_status"),
                                         **({"transcript": m["transcript"]} if "transcript" in m else {}),
                                         **{f"reward/{k}": float(v[i]) for k, v in batch.reward_components.items()}},
                                        default=str) + "\n")
    return summary


def _summarise(examples: Sequence[Example], flat: list[dict[str, Any]], rewards: list[float], correct: list[bool],
               spec: RewardSpec, n: int, ks: Sequence[int]) -> dict[str, Any]:
    """Accuracy, reward, length, pass@k and maj@k over the samples' metadata (n per example)."""
    lens = [m["completion_tokens"] for m in flat]
    out: dict[str, Any] = {
        "prompts": len(examples),
        "samples": len(flat),
        "accuracy": round(mean(correct), 4) if correct else 0.0,
        "mean_reward": round(mean(rewards), 4) if rewards else 0.0,
        "mean_length": round(mean(lens), 2) if lens else 0.0,
        "truncated_frac": round(mean(m["finish_reason"] == "length" for m in flat), 4) if flat else 0.0,
    }
    for k in ks:
        per_prompt_pass, per_prompt_maj = [], []
        for p in range(len(examples)):
            ok = correct[p * n:(p + 1) * n]
            keys = [answer_key(m["completion"], spec) for m in flat[p * n:(p + 1) * n]]
            per_prompt_pass.append(pass_at_k(n, sum(ok), k))
            per_prompt_maj.append(maj_at_k(keys, ok, k))
        out[f"pass@{k}"] = round(mean(per_prompt_pass), 4)
        if k > 1:
            out[f"maj@{k}"] = round(mean(per_prompt_maj), 4)
    return out
