"""Checks on a run's own measurements that catch a broken set-up early, before it trains on garbage."""
from __future__ import annotations

# mean |sampler - learner| log-prob per token that rounding explains: fp32 on both sides, else a low
# precision on one side (measured: 1e-6 in fp32 on every family in docs/models.md; 0.03-0.05 with a
# bf16 engine on SmolLM2-135M)
MISMATCH_LIMIT = {"float32": 1e-2, "low": 0.15}


def mismatch_warning(step: int, first_step: int, mismatch: float | None, learner_precision: str,
                     engine_dtype: str) -> str | None:
    """One line when the sampler's and the learner's log-probs of the same tokens differ by more than
    rounding explains, at the steps where nothing else explains it: the run's first step (no update yet:
    the engine and the learner should compute the same model) and its second (after the first weight push:
    every weight should have reached the engine)."""
    if mismatch is None or step - first_step > 2:
        return None
    exact = learner_precision == "float32" and engine_dtype == "float32"
    limit = MISMATCH_LIMIT["float32" if exact else "low"]
    if mismatch <= limit:
        return None
    when = "before any update" if step == first_step + 1 else "after the first weight push"
    return (f"step {step}: the sampler's and the learner's log-probs of the same tokens differ by {mismatch:.3g} "
            f"per token {when} (rounding explains up to {limit:g} in {'fp32' if exact else 'this precision'}): they "
            f"do not compute the same model; likely an incomplete weight sync, a head or attention feature the "
            f"engine does not reproduce, or a chat template the engine and learner read differently "
            f"(docs/models.md; compare with engine.name=hf)")
