"""What a rollout plugin is (`rollout.kind`): a function `(engine, prompt_ids, examples, params, pad_id,
group_offset) -> Batch` registered in ROLLOUTS, which generates the groups of one round through the
engine; `groups_to_batch` turns the engine's completions into that Batch, `single_turn` is the
default plugin, and `make_rollout` gives the run's plugin with its options bound (in the learner's
process and in every Ray rollout worker)."""
from __future__ import annotations

from typing import Any, Callable, Sequence

from upslope.batch import Batch, build_batch
from upslope.data.types import Example
from upslope.engine import Engine, SamplingParams
from upslope.registry import ROLLOUTS

RolloutFn = Callable[..., Batch]  # (engine, prompt_ids, examples, params, pad_id, group_offset) -> Batch


def groups_to_batch(prompt_ids: Sequence[list[int]], examples: Sequence[Example], groups: Sequence[Sequence[Any]],
                    params: SamplingParams, pad_id: int, version: int, group_offset: int = 0,
                    extra: Sequence[dict[str, Any]] | None = None,
                    loss_masks: Sequence[list[int]] | None = None) -> Batch:
    """The engine's completions (one list per prompt) as a Batch; `extra` adds meta per completion (in
    order) and `loss_masks` marks completion tokens not to train on (e.g. a forced prefix). The batch
    carries the completions' routed experts when every completion has them."""
    p_ids, c_ids, c_lps, gids, trunc, meta, routed = [], [], [], [], [], [], []
    for g, (prompt, ex, comps) in enumerate(zip(prompt_ids, examples, groups)):
        for c in comps:
            p_ids.append(prompt)
            c_ids.append(c.token_ids)
            c_lps.append(c.logprobs)
            gids.append(group_offset + g)
            trunc.append(c.truncated)
            routed.append(c.routed_experts)
            meta.append({**ex.meta, "answer": ex.answer, "prompt": ex.prompt, "completion": c.text,
                         "example_id": ex.id, "completion_tokens": len(c.token_ids),
                         "max_new_tokens": params.max_new_tokens, "finish_reason": c.finish_reason})
    if extra is not None:
        meta = [{**m, **e} for m, e in zip(meta, extra)]
    return build_batch(p_ids, c_ids, c_lps, gids, trunc, pad_id, version, meta, completion_loss_masks=loss_masks,
                       routed_experts=routed)


@ROLLOUTS.register("single_turn", routed_experts=True)
def single_turn(engine: Engine, prompt_ids: Sequence[list[int]], examples: Sequence[Example], params: SamplingParams,
                pad_id: int, group_offset: int = 0) -> Batch:
    """n completions per prompt through the engine, as a Batch (one group per prompt)."""
    return groups_to_batch(prompt_ids, examples, engine.generate(list(prompt_ids), params), params, pad_id,
                           engine.version, group_offset)


def rollout_fn(kind: str) -> RolloutFn:
    """The rollout plugin named by `rollout.kind` (unknown names: one ConfigError line)."""
    return ROLLOUTS.get(kind, "rollout.kind").fn


def make_rollout(cfg: Any, tokenizer: Any, evaluation: bool = False) -> RolloutFn:
    """The rollout of a run: a plugin registered with `setup=fn(cfg, tokenizer, evaluation)` (e.g. multi_turn,
    which needs the agent section) is built by it; a plain one is bound to `rollout.options`. For `evaluation`,
    a plugin registered `train_only` (a training-time shaping of the samples: tree branching, noisy
    prefixes, early stops) gives way to plain sampling, and a setup plugin drops its training-time help
    (multi_turn: no guidance hints), so the held-out score is the policy's own."""
    entry = ROLLOUTS.get(cfg.rollout.kind, "rollout.kind")
    if evaluation and entry.traits.train_only:
        return ROLLOUTS.bind("single_turn", {}, "rollout.options")
    setup = entry.traits.setup
    if setup is not None:
        ROLLOUTS.bind(cfg.rollout.kind, cfg.rollout.options, "rollout.options")  # its options are checked all the same
        return setup(cfg, tokenizer, evaluation)
    return ROLLOUTS.bind(cfg.rollout.kind, cfg.rollout.options, "rollout.options")
