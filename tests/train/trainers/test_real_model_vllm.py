"""Two GRPO steps of the real embedded SmolLM2-135M through the vLLM engine: the weights
pushed after each update reach the engine, whose outputs change accordingly.

Runs in a subprocess: one vLLM engine per process, and the session already holds one.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("vllm")

SCRIPT = textwrap.dedent("""
    import json, sys, torch
    from upslope.config import load_config
    from upslope.engine import SamplingParams
    from upslope.train.trainers.rl import Trainer

    cfg = load_config(None, [f"run_dir={sys.argv[1]}", "engine.name=vllm", "train.steps=2", "train.eval_before=false",
                             "train.eval_after=false", "train.eval_every=0", "log.progress=false",
                             "log.tensorboard=false", "log.plot=false", "optim.lr=1e-4",
                             "rollout.prompts_per_step=4", "rollout.n=4"])
    trainer = Trainer(cfg)
    engine = trainer.runtime.engine
    probe = trainer.prompt_ids[:4]
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=8, stop_token_ids=trainer.runtime.stop_ids)
    before = [g[0] for g in engine.generate(probe, greedy)]
    trainer.run()
    after = [g[0] for g in engine.generate(probe, greedy)]
    # the learner's log-probs of the engine's new greedy tokens must match the engine's (weights in sync)
    from upslope.batch import build_batch
    b = build_batch(probe, [c.token_ids for c in after], [c.logprobs for c in after], range(4), [False] * 4,
                    trainer.runtime.tokenizer.pad_token_id)
    learner_lp = trainer.updater.logprobs(b, temperature=trainer.objective.temperature)
    gap = float(((learner_lp - b.sampler_logprobs).abs() * b.loss_mask).sum() / b.loss_mask.sum())
    print(json.dumps({
        "version": engine.version,
        "tokens_changed": sum(a.token_ids != c.token_ids for a, c in zip(before, after)),
        "logprob_shift": max(abs(x - y) for a, c in zip(before, after) for x, y in zip(a.logprobs, c.logprobs)),
        "sync_gap": gap,
        "steps": len(open(f"{sys.argv[1]}/metrics.jsonl").read().splitlines()),
    }))
    trainer.close()
""")


@pytest.mark.slow  # a real-model vLLM start plus two updates: ~60 s
def test_two_grpo_steps_on_the_real_model_push_weights_into_vllm(tmp_path):
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["version"] == 2 and result["steps"] == 2
    # after two updates at lr 1e-4 the engine samples from different weights ...
    assert result["tokens_changed"] > 0 or result["logprob_shift"] > 1e-2, result
    # ... and from the learner's weights: the engine (bf16) and the learner (bf16 autocast)
    # agree on the new greedy tokens to within bf16 noise (stale weights differ by far more)
    assert result["sync_gap"] < 0.15, result
