"""The checks of the family matrix, as functions returning the largest absolute difference found (the
tests assert bounds on them; tests/models/conftest.py can write them as docs/models.md's table).

A batch of two groups of two samples: prompts of 20 and 14 tokens, completions of different lengths
(right-padded), 40 tokens in all, so that 16-token sliding windows act, the shared-prompt path runs
left-padded prompts, and each row is compared with the model's own plain forward over that row alone."""
from __future__ import annotations

from typing import Any

import torch

from upslope.train.learner.logprobs import token_scores

PROMPTS, LENGTHS, GROUPS = (30, 30, 6, 6), (48, 39, 30, 17), (0, 0, 1, 1)
# the families whose slower checks (gradients, sampling engines, routing beyond replay and the balancing loss) run
# with -m slow only, so that the default run stays within its time
SLOW_CHECKS = {"llama4", "lfm2", "falcon_h1", "granitemoehybrid", "qwen3_next"}


def families(names: list[str], slow: set[str] = SLOW_CHECKS) -> list[Any]:
    """`names` as pytest parameters, those in `slow` marked slow."""
    import pytest

    return [pytest.param(n, marks=pytest.mark.slow) if n in slow else n for n in names]


def run_marks(family: str, default: set[str]) -> list[Any]:
    """Where a family's check runs: the default run for those in `default`, -m slow only for SLOW_CHECKS, and
    otherwise CI's slow set (-m "slow and ci")."""
    import pytest

    if family in default:
        return []
    from markers import IN_CI_SLOW_SET

    return [pytest.mark.slow] if family in SLOW_CHECKS else IN_CI_SLOW_SET


# families transformers' continuous batching cannot run, and what its model check names as the reason
PAGED_REFUSED = {"deepseek_v3": "multi-head latent attention", "llama4": "chunked_attention layers",
                 "lfm2": "recurrent layer", "falcon_h1": "recurrent layers", "granitemoehybrid": "recurrent layer",
                 "qwen3_next": "recurrent layer"}


def batch(vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    n, width = len(PROMPTS), max(LENGTHS)
    ids = torch.randint(3, min(vocab, 30_000), (n, width), generator=gen)
    for row in (1, 3):  # the second sample of each group repeats the first one's prompt
        ids[row, :PROMPTS[row]] = ids[row - 1, :PROMPTS[row]]
    lengths, prompts = torch.tensor(LENGTHS), torch.tensor(PROMPTS)
    cols = torch.arange(width)[None]
    attention = (cols < lengths[:, None]).long()
    return {"input_ids": ids * attention, "attention_mask": attention, "prompt_lens": prompts, "seq_lens": lengths,
            "target_mask": ((cols >= prompts[:, None]) & (attention > 0)).long(), "group_ids": torch.tensor(GROUPS)}


def plain_scores(model: Any, b: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob and entropy of every target token from the model's own forward, one unpadded row at a time."""
    lp, ent = torch.zeros(b["input_ids"].shape), torch.zeros(b["input_ids"].shape)
    for i, length in enumerate(b["seq_lens"].tolist()):
        logits = model(input_ids=b["input_ids"][i:i + 1, :length]).logits[0, :-1].float()
        logp = torch.log_softmax(logits, -1)
        lp[i, 1:length] = logp.gather(-1, b["input_ids"][i, 1:length, None])[:, 0]
        ent[i, 1:length] = -(logp.exp() * logp).sum(-1)
    mask = b["target_mask"].float()
    return lp * mask, ent * mask


MODES = {"rows": {}, "shared prompt": {"shared": True}, "checkpointed layers": {"checkpoint_layers": True},
         "entropy gradient": {"entropy_grad": True}, "packed rows": {"packed": True},
         "packed shared prompt": {"shared": True, "packed": True},
         "packed, checkpointed": {"shared": True, "packed": True, "checkpoint_layers": True}}


def learner_scores(model: Any, b: dict[str, torch.Tensor], mode: str) -> Any:
    opts = dict(MODES[mode])
    shared = (b["prompt_lens"], b["seq_lens"], b["group_ids"]) if opts.pop("shared", False) else None
    return token_scores(model, b["input_ids"], b["attention_mask"], b["target_mask"], shared=shared, chunk_rows=7,
                        **opts)


def forward_difference(model: Any, mode: str) -> tuple[float, float]:
    """max |learner - plain forward| of the log-probs and of the entropies, in `mode`."""
    b = batch(model.get_output_embeddings().weight.shape[0])
    with torch.no_grad():
        ref_lp, ref_ent = plain_scores(model, b)
        out = learner_scores(model, b, mode)
    return float((out.logprobs - ref_lp).abs().max()), float((out.entropy - ref_ent).abs().max())


def gradient_difference(model: Any, mode: str) -> float:
    """max over parameters of |learner grad - plain autograd grad| / max |plain grad| for the loss
    sum(w * log-prob) with fixed random token weights w."""
    b = batch(model.get_output_embeddings().weight.shape[0], seed=1)
    weights = torch.randn(b["input_ids"].shape, generator=torch.Generator().manual_seed(2))
    model.zero_grad()
    ref_lp, _ = plain_scores(model, b)
    (ref_lp * weights).sum().backward()
    ref = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    (learner_scores(model, b, mode).logprobs * weights).sum().backward()
    # a parameter whose gradients are all under a hundredth of the model's largest (a hybrid's state decay
    # rates: ~1e-4 of it) is measured against that hundredth: below it fp32 rounding of the sums dominates
    floor = 0.01 * max(float(g.abs().max()) for g in ref.values())
    worst = 0.0
    for name, p in model.named_parameters():
        if name in ref:
            worst = max(worst, float((p.grad - ref[name]).abs().max()) / max(float(ref[name].abs().max()), floor))
    model.zero_grad()
    return worst


def sampler_gaps(engine: Any, policy: Any, tokenizer: Any, close: bool = True) -> tuple[float, float]:
    """`engine_difference` on three prompts before and after a `large_update` of `policy` pushed into `engine`
    (which is then closed, unless `close` is false)."""
    prompts = [tokenizer.encode(f"Question {i}: how many legs do {i} spiders have?") for i in range(3)]
    before = engine_difference(engine, policy, prompts)
    large_update(policy)
    engine.update_weights(policy.named_parameters())
    after = engine_difference(engine, policy, prompts, seed=1)
    if close:
        engine.close()
    return before, after


def engine_difference(engine: Any, policy: Any, prompts: list[list[int]], seed: int = 0) -> float:
    """max |sampler log-prob - learner log-prob| over the tokens `engine` samples (n = 2, 12 tokens) from
    `prompts`, the learner scoring them with `policy` at the sampling temperature."""
    from upslope.engine import SamplingParams

    groups = engine.generate(prompts, SamplingParams(n=2, temperature=1.0, max_new_tokens=12, seed=seed))
    worst = 0.0
    for prompt, group in zip(prompts, groups):
        for c in group:
            ids = torch.tensor([prompt + c.token_ids])
            target = torch.zeros_like(ids)
            target[0, len(prompt):] = 1
            with torch.no_grad():
                lp = token_scores(policy, ids, torch.ones_like(ids), target).logprobs[0, len(prompt):]
            worst = max(worst, float((lp - torch.tensor(c.logprobs)).abs().max()))
    return worst


def large_update(model: Any, seed: int = 3, scale: float = 0.05, only: str = "", floor: float = 1e-3) -> None:
    """Move every weight (those whose name contains `only`) by scale x its own RMS, at least `floor`, in a random
    direction (every such tensor changes)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if only in name:
                p.add_(torch.randn(p.shape, generator=gen) * scale * p.float().pow(2).mean().sqrt().clamp(min=floor))
