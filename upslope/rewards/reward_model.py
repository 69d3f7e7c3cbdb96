"""The `reward_model` reward: a trained reward model (an `upslope rm` checkpoint, or any Hugging
Face sequence-classification model with one label) scores each completion after its prompt.

The text is re-tokenised with the reward model's tokenizer exactly as `upslope rm` tokenised
its pairs (the prompt through the chat template, the reply's text tokens, the end token), and
that tokenizer must be the policy's: a reward model trained on another tokenizer's ids is a
one-line error when the run starts, not a silently meaningless score. Scores are computed
without gradient in token-budget batches, optionally normalised (batch whitening, or a running
mean and standard deviation over every batch so far)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

from upslope.algos.credit import RM_STATE
from upslope.bounds import PositiveCount
from upslope.errors import ConfigError, UpslopeError
from upslope.registry import REWARDS
from upslope.rewards.context import RewardContext

_SCORERS: dict[tuple[str, str, str], "RewardModelScorer"] = {}


@dataclass
class RunningStats:
    """Running mean and variance (Welford's update, batch by batch)."""

    count: int = 0
    mean: float = 0.0
    m2: float = 0.0

    def update(self, values: Sequence[float]) -> None:
        for v in values:
            self.count += 1
            delta = v - self.mean
            self.mean += delta / self.count
            self.m2 += delta * (v - self.mean)

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / self.count) if self.count else 0.0


def normalize_scores(scores: Sequence[float], how: str, stats: RunningStats | None = None,
                     eps: float = 1e-6) -> list[float]:
    """none: as is; batch: (s - batch mean) / (batch std + eps); running: the running stats are
    first updated with this batch, then (s - running mean) / (running std + eps)."""
    values = [float(s) for s in scores]
    if how == "none" or not values:
        return values
    if how == "batch":
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    elif how == "running":
        assert stats is not None
        stats.update(values)
        mean, std = stats.mean, stats.std
    else:
        raise ValueError(f"unknown normalisation {how!r}")
    return [(v - mean) / (std + eps) for v in values]


@dataclass
class RewardModelScorer:
    """A loaded reward model and its tokenizer (one per path, device and dtype, shared by the run)."""

    path: str
    model: Any
    tokenizer: Any
    device: Any
    stats: dict[str, RunningStats] = field(default_factory=dict)
    prompt_cache: dict[str, list[int]] = field(default_factory=dict)

    def check_tokenizer(self, policy_tokenizer: Any) -> None:
        """One ConfigError line when the policy's tokenizer is not the reward model's."""
        from upslope.scalar_head import tokenizer_difference

        diff = tokenizer_difference(self.tokenizer, policy_tokenizer)
        if diff:
            raise ConfigError(f"path={self.path}: the reward model's tokenizer differs from the policy's ({diff}); "
                              f"train it from the policy's model (upslope rm with the same model.name)")

    def prompt_ids(self, prompt: Any, system_prompt: str | None, use_chat_template: bool) -> list[int]:
        from upslope.data.prompts import encode_prompts
        from upslope.data.types import Example

        key = repr((prompt, system_prompt, use_chat_template))
        if key not in self.prompt_cache:
            ids, _ = encode_prompts([Example(prompt=prompt)], self.tokenizer, system_prompt=system_prompt,
                                    use_chat_template=use_chat_template)
            self.prompt_cache[key] = ids[0]
        return self.prompt_cache[key]

    def score(self, prompts: Sequence[Any], completions: Sequence[str], *, system_prompt: str | None,
              use_chat_template: bool, micro_batch_tokens: int,
              system_prompts: Sequence[str | None] | None = None) -> tuple[list[float], Any]:
        """Raw scores of each (prompt, completion) and the [N, D] hidden states the head read (on the host);
        `system_prompts` gives each prompt its own system prompt (a per-sample specification) instead of the
        one `system_prompt`."""
        from upslope.batch import build_batch
        from upslope.data.pairs import encode_reply
        from upslope.scalar_head import score_and_state_rows

        tok = self.tokenizer
        end = tok.eos_token_id if tok.eos_token_id is not None else tok.pad_token_id
        systems = list(system_prompts) if system_prompts is not None else [system_prompt] * len(prompts)
        p_ids = [self.prompt_ids(p, s, use_chat_template) for p, s in zip(prompts, systems)]
        c_ids = [encode_reply(tok, c, end) for c in completions]
        batch = build_batch(p_ids, c_ids, [[0.0] * len(c) for c in c_ids], list(range(len(c_ids))),
                            [False] * len(c_ids), tok.pad_token_id)
        scores, states = score_and_state_rows(self.model, batch, micro_batch_tokens, self.device)
        return scores.tolist(), states


def load_scorer(path: str, device: str = "auto", dtype: str = "float32") -> RewardModelScorer:
    """The reward model at `path` (loaded once per process and kept)."""
    key = (path, device, dtype)
    if key not in _SCORERS:
        import torch

        from upslope.models import load_tokenizer, resolve_model
        from upslope.scalar_head import load_scalar_model

        where = resolve_model(path, option="reward.options.path")
        tok = load_tokenizer(where)
        dev = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device)
        model = load_scalar_model(where, dtype=dtype, pad_id=tok.pad_token_id).to(dev).eval()
        model.requires_grad_(False)
        _SCORERS[key] = RewardModelScorer(path, model, tok, dev)
    return _SCORERS[key]


@REWARDS.register("reward_model", batched=True, context=True)
def reward_model_reward(completions: list[str], answers: list[Any], metas: list[dict],
                        context: RewardContext | None = None, *, path: str,
                        normalize: Literal["none", "batch", "running"] = "none",
                        micro_batch_tokens: PositiveCount = 4096, device: str = "auto",
                        dtype: Literal["float32", "bfloat16"] = "float32", system_prompt: str | None = None,
                        use_chat_template: bool = True, spec_field: str = "", keep_states: bool = False) -> list[float]:
    """A trained reward model's score of each completion after its prompt (batched, no gradient).

    path: an `upslope rm` checkpoint or HF sequence-classification model directory (the policy's tokenizer)
    normalize: none, batch (whiten each batch) or running (running mean/std over every batch so far)
    micro_batch_tokens: token budget (rows x longest row) of one scoring forward pass
    device: where the reward model runs: auto (the GPU when there is one, like the learner), cpu, cuda, cuda:1
    dtype: the reward model's weights: float32 or bfloat16
    system_prompt: system prompt used when the reward model was trained (as data.system_prompt there)
    use_chat_template: wrap prompts with the chat template, as the reward model's training did
    spec_field: meta field holding each sample's written specification, given to the reward model as its system prompt (empty: system_prompt for all)
    keep_states: write each sample's hidden state that the head read to meta['reward_model_state'] (GraphAE's edges)

    With `spec_field` the reward model is conditioned on a specification that may differ per
    example (CSRM's configurable reward model: what counts as acceptable is written in the data, and
    the model is trained with each pair's specification as the system message of its prompt).
    """
    scorer = load_scorer(path, device, dtype)
    if context is not None and context.policy_tokenizer is not None:
        scorer.check_tokenizer(context.policy_tokenizer)
    if not completions:
        return []
    prompts = []
    for m in metas:
        if "prompt" not in m:
            raise UpslopeError("reward_model: the samples carry no prompt (meta['prompt']); it scores completions "
                               "only where the rollout records their prompts")
        prompts.append(m["prompt"])
    systems = None
    if spec_field:
        missing = [i for i, m in enumerate(metas) if not isinstance(m.get(spec_field), str)]
        if missing:
            raise UpslopeError(f"reward_model: spec_field={spec_field}: sample {missing[0]} has no text in that field "
                               f"(each example needs its specification)")
        systems = [m[spec_field] for m in metas]
    raw, states = scorer.score(prompts, completions, system_prompt=system_prompt, use_chat_template=use_chat_template,
                               micro_batch_tokens=micro_batch_tokens, system_prompts=systems)
    if keep_states:  # the sample's own meta: advantages read it from the batch (upslope.algos.credit.graphae)
        for m, h in zip(metas, states):
            m[RM_STATE] = h.clone()
    return normalize_scores(raw, normalize, scorer.stats.setdefault(normalize, RunningStats()))
