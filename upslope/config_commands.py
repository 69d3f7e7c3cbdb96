"""Config sections of the commands besides `upslope train`'s RL loop: sft, rft, dpo, rm, distill,
randopt, and the sharded learner (`dist`)."""
from __future__ import annotations

from typing import Literal

from upslope.config_base import Plugin, Section, opt


class PairFileConfig(Section):
    """Where preference pairs come from when they are read from a file (dpo and rm)."""

    path: str | None = opt(None, "source=dataset: JSONL / Parquet file or HF dataset directory of pairs")
    split: str | None = opt(None, "split of an HF dataset directory")
    prompt_field: str = opt("prompt", "field holding the prompt (text or chat messages)")
    chosen_field: str = opt("chosen", "field holding the preferred reply (text, or messages ending with it)")
    rejected_field: str = opt("rejected", "field holding the dispreferred reply (text, or messages ending with it)")
    limit: int | None = opt(None, "use only the first N pairs of the file", ge=1)
    shuffle: bool = opt(True, "shuffle the file's pairs each epoch (seeded)")


class DistillConfig(Section):
    """On-policy distillation (`upslope distill`): the student samples, a teacher scores the same tokens."""

    teacher: str | None = opt(None, "teacher: model name/path/.gguf, a checkpoint RUN/checkpoints/step_N, a run "
                                    "directory (its latest checkpoint), or 'self' (the student's starting weights)")
    teacher_gguf_file: str | None = opt(None, "GGUF file name inside `teacher` when it is a directory of GGUF files")
    teacher_temperature: float = opt(1.0, "temperature of the teacher's distribution (self-distillation: TS-OPSD "
                                          "reheats with > 1)", gt=0)
    loss: Plugin = opt(Plugin(name="sampled_rkl"), "distillation loss (registry: distill_loss): sampled_rkl, "
                                                   "topk_rkl, forward_ce, mix (its options: the weights)",
                    registry="distill_loss")
    top_k: int = opt(20, "teacher's most likely tokens kept per position (top-k losses and metrics)", ge=1)
    log_reward: bool = opt(True, "score the student's samples with the task reward (logged, not trained on)")


class SFTConfig(Section):
    """`upslope sft`: supervised fine-tuning on data.path (chats via data.messages_field, or
    data.prompt_field + response_field); the loss covers assistant tokens only."""

    batch_size: int = opt(8, "conversations per optimiser step", ge=1)
    dft: bool = opt(False, "DFT: weight each token's NLL by its detached probability (sft and rft)")
    response_field: str = opt("response", "field holding the reply in prompt/response rows")
    epochs: float | None = opt(None, "when set, train.steps = ceil(epochs x conversations / batch_size)", gt=0)
    max_tokens: int = opt(2048, "longer conversations are an error (or dropped with drop_long)", ge=2)
    drop_long: bool = opt(False, "drop conversations over max_tokens instead of failing")


class RFTConfig(Section):
    """`upslope rft` (rejection-sampling fine-tuning / expert iteration): each train step is a
    round: rollout.n samples for prompts_per_round prompts, keep reward >= threshold,
    fine-tune on them with the SFT loss."""

    prompts_per_round: int = opt(64, "prompts sampled per round", ge=1)
    threshold: float = opt(1.0, "keep completions whose combined reward is >= this")
    dedupe: bool = opt(True, "keep identical completions of a prompt once")
    max_per_prompt: int | None = opt(None, "keep at most this many completions per prompt (None: all)", ge=1)
    epochs: int = opt(1, "passes over the kept samples per round", ge=1)
    batch_size: int = opt(16, "kept samples per optimiser step (mini-batches of whole prompt groups)", ge=1)
    write_samples: bool = opt(True, "append kept samples to RUN/rft_samples.jsonl (a chat dataset for upslope sft)")


class DPOConfig(PairFileConfig):
    """Preference optimisation (`upslope dpo`): DPO, IPO or SimPO on pairs from a file or from
    the policy's own samples scored by the reward(s)."""

    loss: Plugin = opt(Plugin(name="sigmoid"), "preference loss (registry: preference_loss): sigmoid (DPO), "
                       "ipo, simpo; options: beta, label_smoothing (sigmoid, simpo), gamma (simpo)",
                       registry="preference_loss")
    source: Literal["on_policy", "dataset"] = opt("on_policy", "pairs from the policy's own samples (best vs "
                                                  "worst of a group, by the reward) or from the file dpo.path")
    pairs_per_step: int = opt(16, "pairs per step; on_policy: rollout rounds of rollout.prompts_per_step prompts "
                                  "(at most 1 + rollout.max_resample_rounds) until this many are built", ge=1)
class RMConfig(PairFileConfig):
    """Reward-model training (`upslope rm`): a scalar head on a causal LM, Bradley-Terry loss on
    preference pairs from a file or from the policy's own samples labelled by the reward(s)."""

    source: Literal["on_policy", "dataset"] = opt("on_policy", "pairs from the policy's samples (rollout.n per "
                                                  "prompt; a rewarded vs an unrewarded completion) or from rm.path")
    model: str | None = opt(None, "model the reward model starts from (default: model.name; same tokenizer)")
    margin: float = opt(0.0, "Bradley-Terry margin: loss = -log sigmoid(r_chosen - r_rejected - margin)")
    calibration_coef: float = opt(0.0, "weight of a calibration term: binary cross-entropy of sigmoid(score) against "
                                       "each reply's label (chosen 1, rejected 0; on_policy: its reward in [0, 1])",
                                  ge=0)
    pairs: Literal["best_worst", "lookahead_steps"] = opt(
        "best_worst", "on_policy: a group's best against its worst completion, or PRISM's step pairs from tree "
                      "rollouts (rollout.kind=tree): the best-valued step against the likeliest sibling step that "
                      "its look-ahead leaves value lower, one pair a tree")
    pairs_per_step: int = opt(16, "pairs per optimiser step (on_policy: up to 1 + rollout.max_resample_rounds "
                                  "rollout rounds of rollout.prompts_per_step prompts)", ge=1)
    eval_pairs: int = opt(64, "held-out pairs for pairwise accuracy (dataset: the file's last N, unless "
                              "rm.eval_path; on_policy: built once from the evaluation prompts)", ge=1)
    eval_path: str | None = opt(None, "dataset: a separate file of held-out pairs (default: the last rm.eval_pairs "
                                      "pairs of rm.path)")


class RandOptConfig(Section):
    """`upslope randopt`: gradient-free search in weight space. Each step scores `population` perturbed
    copies of the policy (seeded Gaussian noise, pushed into the rollout engine) on the same prompts and
    folds them into one update (`consolidate`: es or corp)."""

    population: int = opt(8, "perturbed copies of the policy scored each step (K; even with antithetic)", ge=2)
    sigma: float = opt(1e-3, "standard deviation of the Gaussian noise added to every weight", gt=0)
    antithetic: bool = opt(True, "mirrored pairs: perturbations +sigma d and -sigma d share one noise direction")
    consolidate: Plugin = opt(Plugin(name="es"), "how the scored perturbations become one update (registry: "
                                                 "consolidate): es (evolution strategies), corp (CoRP)",
                              registry="consolidate")
    gate_prompts: int = opt(0, "held-out gate: prompts drawn after the step's, on which the updated model must "
                               "score at least the current one, else the update is dropped (0: off)", ge=0)
    gate_tolerance: float = opt(0.0, "the gate also accepts an update whose mean reward is at most this much "
                                     "below the current model's", ge=0)


class DistConfig(Section):
    """The sharded learner: N learner processes (torch.distributed); rank 0 also owns the engine and data."""
    learner_procs: int = opt(1, "learner processes (1: today's single-process learner; N: the trainer spawns N "
                                "ranks on this machine, or set by torchrun's WORLD_SIZE)", ge=1)
    strategy: Literal["ddp", "fsdp"] = opt("fsdp", "ddp: every rank holds the whole model, gradients are summed; "
                                                   "fsdp: FSDP2 fully_shard per decoder layer (parameters, gradients "
                                                   "and optimiser state split across ranks)")
    cpu_offload: bool = opt(False, "fsdp: keep the parameter shards and optimiser state in CPU memory (GPU runs)")
    backend: Literal["auto", "gloo", "nccl"] = opt("auto", "collective backend (auto: nccl on GPUs, gloo on CPU)")
    rollout_workers: int = opt(0, "rollout workers as Ray actors, each with its own engine (0: the in-process "
                                  "engine of the synchronous loop)", ge=0)
    address: str = opt("", "Ray cluster address for the workers ('' : start a local Ray; 'auto' or HOST:PORT: "
                            "join a cluster started with `ray start --head`)")
    worker_cpus: float = opt(1.0, "CPUs Ray reserves for each rollout worker", gt=0)
    worker_gpus: float = opt(0.0, "GPUs Ray reserves for each rollout worker (untested: no GPU run yet)", ge=0)
    worker_resources: dict[str, float] = opt({}, "custom Ray resources each worker needs (e.g. {rollout: 1} to "
                                                 "place workers on nodes started with that resource)")
    worker_cores: list[int] = opt([], "pin worker i to CPU core worker_cores[i % len] (os.sched_setaffinity); "
                                      "empty: no pinning")
    max_restarts: int = opt(3, "times Ray restarts a rollout worker that died (its groups are re-issued)", ge=0)


class PipelineConfig(Section):
    """The asynchronous pipeline between the rollout workers and the learner (dist.rollout_workers > 0)."""
    max_staleness: int = opt(0, "weight versions a sample may lag the learner (0: synchronous; older samples are "
                                "dropped and regenerated)", ge=0)
    partial: Literal["finish", "discard"] = opt("finish", "groups in flight when new weights arrive: finish them "
                                                          "with the old weights, or discard and regenerate them")
    chunk_groups: int = opt(0, "prompt groups per worker job, handed to the learner as each job completes "
                               "(0: a whole rollout round per job, as the synchronous loop generates it)", ge=0)
    queue_depth: int = opt(2, "jobs queued on each worker at once (keeps it busy while the learner updates)", ge=1)
    stale_correction: Literal["clip", "token", "uncorrected"] = opt(
        "clip", "what bounds the update of samples up to max_staleness versions old (max_staleness > 0): clip = take "
                "the loss's ratio against the sampler's log-probs (algo.old_policy=sampler, unless set); token = "
                "token-level TIS, cap 2 (algo.correction, unless set); uncorrected = neither (warned)")
    stream: bool = opt(True, "while waiting for a step's groups, forward and backward those that have arrived "
                             "(the update equals the whole-batch one up to float rounding; methods with "
                             "batch-level steps wait for the whole batch)")
