"""The typed config tree: YAML recipe + dotted command-line overrides, validated.

Every option has a default that works and a one-line description (`upslope config
options` lists them). Unknown keys and wrong types are ConfigErrors that name the key,
say what was expected and suggest the closest valid key. An option that names a plugin
declares its registry (`opt(..., registry="engine")`); after the user's `plugins` modules
are imported, every such name is checked against its registry.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, Field, PrivateAttr, ValidationError, field_validator, model_validator

from upslope.config_base import SEED_RANGE, Plugin, RewardSpec, Section, opt, opt_factory
from upslope.config_checks import check_idle_options, check_moved, check_plugin_names
from upslope.config_commands import (DistConfig, DistillConfig, DPOConfig, PipelineConfig, RandOptConfig, RFTConfig,
                                     RMConfig, SFTConfig)
from upslope.config_files import absolute_plugin_files, apply_override, merge, read_recipe
from upslope.config_schema import describe, option_rows
from upslope.errors import ConfigError


class ModelConfig(Section):
    name: str = opt("smollm2-135m-instruct", "HF id, local directory, .gguf file, or 'smollm2-135m-instruct'")
    gguf_file: str | None = opt(None, "GGUF file name inside `name` when it is a directory of GGUF files")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = opt(
        "auto", "learner weights' dtype (auto, on a CPU: bfloat16 when train.precision is bfloat16, so weights, "
                "gradients and AdamW moments take 2 bytes each; on a GPU: float32; float32 weights with bf16 "
                "precision: mixed, bf16 autocast)")
    cache_dir: str | None = opt(None, "where converted models are cached (default ~/.cache/upslope)")
    trust_remote_code: bool = opt(False, "allow model code from the model directory")
    chat_template: str | None = opt(None, "Jinja chat template (text or file path) replacing the tokenizer's")
    use_chat_template: bool = opt(True, "wrap prompts with the chat template (false: raw text prompts)")


class SpeculativeConfig(Section):
    method: Literal["off", "ngram"] = opt("off", "vllm: speculative decoding (ngram: draft tokens looked up in the "
                                                 "prompt and the reply so far, verified by the model in one forward; "
                                                 "the sampled distribution is unchanged)")
    num_speculative_tokens: int = opt(4, "draft tokens proposed per step", ge=1, le=16)
    prompt_lookup_max: int = opt(4, "ngram: longest n-gram matched", ge=1, le=16)
    prompt_lookup_min: int = opt(2, "ngram: shortest n-gram matched", ge=1, le=16)

    @model_validator(mode="after")
    def _lookup_range(self) -> "SpeculativeConfig":
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(f"prompt_lookup_min {self.prompt_lookup_min} is above prompt_lookup_max "
                             f"{self.prompt_lookup_max}")
        return self


class EngineConfig(Section):
    name: str = opt("auto", "rollout engine (registry: engine); auto: vllm if importable, else hf", registry="engine")
    options: dict[str, Any] = opt({}, "options of the engine's builder (its keyword-only parameters; "
                                      "see upslope plugins engine)")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = opt(
        "auto", "engine dtype (auto: vllm: bfloat16 where this machine computes bf16 natively and measured it "
                "faster, else float32; hf: model.dtype on a CPU, the precision on a GPU; see upslope doctor)")
    enforce_eager: bool = opt(True, "vllm: skip graph compilation (starts in seconds instead of minutes)")
    kv_cache_gb: float | None = opt(None, "vllm on CPU: KV-cache size in GiB (None: sized for one rollout batch, "
                                          "prompts_per_step x n x (128 + max_new_tokens) tokens, at most 1 GiB or "
                                          "1/16 of memory)", gt=0)
    gpu_memory_utilization: float = opt(0.5, "vllm on GPU: fraction of GPU memory for the engine", gt=0, le=1)
    tensor_parallel_size: int = opt(1, "vllm on GPU: GPUs the engine's weights are split over (vLLM's tensor "
                                       "parallelism); only 1 until the weight sync has run with more", ge=1)
    sleep_mode: bool = opt(True, "vllm on GPU: free the KV cache and offload the weights to the host while the "
                                 "learner trains (vLLM sleep level 1), woken for the weight sync and generation")
    max_num_seqs: int = opt(256, "most sequences the engine runs at once", ge=1)
    max_model_len: int | None = opt(None, "context length for the engine (default: prompt + max_new_tokens bound)")
    hf_batch_size: int = opt(64, "hf engine: prompts per generate call", ge=1)
    speculative: SpeculativeConfig = opt(SpeculativeConfig(), "vllm: speculative decoding (off by default)")
    seed: int = opt(0, "engine sampling seed, mixed into every rollout's and evaluation's seed for every engine "
                       "(0: the run's own seeds; 0 <= seed < 2**32)", **SEED_RANGE)

    @field_validator("tensor_parallel_size")
    @classmethod
    def _one_gpu_engine(cls, size: int) -> int:
        """The in-place weight sync hands vLLM a generator, which its in-process engine takes; with tensor
        parallelism vLLM runs a process per GPU and would have to serialise it. Refused until that has run."""
        if size > 1:
            raise ValueError(f"{size} GPUs: the in-place weight sync has not run with vLLM's tensor-parallel "
                             "workers (one process per GPU); only 1 is supported")
        return size


class DataConfig(Section):
    task: str = opt("arith", "built-in task (arith, gsm8k, math500, humaneval, ...) used when `path` is empty")
    options: dict[str, Any] = opt({}, "options of the task (e.g. ops, digits, count, seed for arith)")
    path: str | None = opt(None, "JSONL / JSON / CSV / Parquet file, dataset directory (saved, or data files "
                                 "named by split) or Hugging Face Hub id, instead of a built-in task")
    split: str | None = opt(None, "split of a dataset directory, Hub dataset or task (default: train for "
                                  "training, test for evaluation where the source has one)")
    subset: str | None = opt(None, "configuration (subset) of a Hugging Face Hub dataset, e.g. 'main' for gsm8k")
    prompt_field: str = opt("prompt", "field holding the prompt text (left at prompt: detected from the "
                                      "columns, e.g. TRL's conversational prompt, messages, question)")
    messages_field: str | None = opt(None, "field holding chat messages instead of prompt text")
    answer_field: str | None = opt("answer", "field holding the reference answer; a dotted path reads nested "
                                             "fields (left at answer: detected, e.g. reward_model.ground_truth, "
                                             "solution)")
    system_prompt: str | None = opt(None, "system message prepended to every prompt")
    template: str = opt("{prompt}", "instruction template; {prompt} is replaced by the prompt text")
    limit: int | None = opt(None, "use only the first N examples", ge=1)
    shuffle: bool = opt(True, "training only: shuffle prompt order each epoch (seeded; passed to the sampler)")
    sampler: Plugin = opt(Plugin(name="uniform"), "training only: prompt sampler (registry: sampler) and its options",
                          registry="sampler")

    @model_validator(mode="before")
    @classmethod
    def _split_option(cls, data: Any) -> Any:
        """A task's split given as its option (options.split) is `split`: one place, so that evaluation's
        test split replaces it as it replaces `split`; the two given apart must agree."""
        if not isinstance(data, dict) or not isinstance(data.get("options"), dict) or "split" not in data["options"]:
            return data
        options = dict(data["options"])
        given = options.pop("split")
        if data.get("split") not in (None, given):
            raise ValueError(f"split={data['split']!r} and options.split={given!r} disagree: give the split once")
        return {**data, "options": options, "split": given}


DEFAULT_PROMPT_TOKENS = 512  # rollout.max_prompt_tokens when unset (less when the model's context is short)


class RolloutConfig(Section):
    kind: str = opt("single_turn", "rollout plugin that turns prompts into completions (registry: rollout)")
    options: dict[str, Any] = opt({}, "options of the rollout plugin named by kind (e.g. espo's margin)")
    prompts_per_step: int = opt(8, "prompts sampled per training step", ge=1)
    n: int = opt(8, "completions per prompt (the group size)", ge=1)
    temperature: float = opt(1.0, "sampling temperature", ge=0)
    top_p: float = opt(1.0, "nucleus sampling mass (the learner scores the same truncated distribution)", gt=0, le=1)
    top_k: int = opt(0, "top-k sampling, 0: off (the learner scores the same truncated distribution)", ge=0)
    max_new_tokens: int | None = opt(None, "most tokens generated per completion (default: the task's, "
                                              "e.g. arith 8, gsm8k 256, math500 512; 256 for data files)", ge=1)
    max_prompt_tokens: int | None = opt(None, "longest prompt in tokens; longer prompts are an error (or dropped "
                                              "with drop_long_prompts) (default: 512, or what the model's context "
                                              "leaves beside the reply length when that is less)", ge=1)
    drop_long_prompts: bool = opt(False, "drop prompts over max_prompt_tokens instead of failing")
    max_resample_rounds: int = opt(4, "filters: most extra rollout rounds to refill a filtered batch", ge=0)


class CorrectionConfig(Section):
    """Truncated importance sampling against the sampler's log-probs (train/inference mismatch)."""

    level: Literal["token", "sequence", "geometric"] = opt("token", "ratio per token, per sequence (product), or geometric mean")
    cap: float = opt(2.0, "truncate importance weights above this", gt=0)
    mask_low: float | None = opt(None, "reject tokens/sequences whose ratio is below this: not trained, not counted in the "
                                       "loss's normalisers (one extra no-grad forward with one update per batch)", gt=0)
    mask_high: float | None = opt(None, "reject tokens/sequences whose ratio is above this (as mask_low)", gt=0)


class AlgoConfig(Section):
    advantage: Plugin = opt(Plugin(name="grpo"), "advantage estimator (registry: advantage)", registry="advantage")
    policy_loss: Plugin = opt(Plugin(name="ppo_clip"), "per-token policy loss (registry: policy_loss)",
                              registry="policy_loss")
    loss_agg: Literal["token_mean", "seq_mean_token_mean", "seq_sum_constant"] = opt(
        "token_mean", "how per-token losses are reduced")
    loss_agg_constant: float | None = opt(None, "seq_sum_constant divisor (default: rollout.max_new_tokens)")
    kl_coef: float = opt(0.0, "beta: weight of KL to the frozen reference (0: no reference model loaded)", ge=0)
    kl_estimator: str = opt("k3", "KL estimator (registry: kl)", registry="kl")
    kl_in: Literal["loss", "reward"] = opt("loss", "apply KL as a loss term or fold it into token rewards")
    kl_target: float | None = opt(None, "adaptive KL: target KL per token (None: fixed kl_coef)", gt=0)
    kl_horizon: int = opt(10000, "adaptive KL: horizon in samples", ge=1)
    entropy_coef: float = opt(0.0, "entropy bonus: subtract coef x token entropy from the loss (0: off)", ge=0)
    old_policy: Literal["auto", "learner", "sampler"] = opt(
        "auto", "what the policy loss's ratio is taken against: learner = the learner's weights before this "
                "batch's update (ratio 1 with one update per batch); sampler = the engine's log-probs, the policy "
                "that generated the samples (the clip then bounds the update of stale samples); auto = sampler "
                "when pipeline.max_staleness > 0 and pipeline.stale_correction=clip, else learner")
    correction: CorrectionConfig | None = opt(None, "train/inference mismatch correction (TIS); None: off, "
                                                                 "except with stale samples (pipeline.stale_correction)")
    terms: list[Plugin] = opt([], "more terms of the RL loss, added in order after the policy loss and the "
                                  "correction, e.g. dcmdp (registry: loss_term)", registry="loss_term")
    accept: Plugin | None = opt(None, "a check that may veto each update (undone: weights and optimiser state), "
                                      "e.g. mipu (registry: accept); None: off", registry="accept")
    mask_truncated: bool = opt(False, "train on nothing from completions cut at max_new_tokens (DAPO overlong filtering)")
    filters: list[Plugin] = opt([], "batch filters, e.g. nonzero_std for DAPO dynamic sampling", registry="filter")
    reward_combiner: Plugin = opt(Plugin(name="weighted_sum"), "how named reward components combine",
                                  registry="reward_combiner")
    replay: Plugin | None = opt(None, "rollout replay between advantage and update (registry: replay), e.g. "
                                      "fresh_anchored or rerule; None: off", registry="replay")
    routing_replay: bool = opt(False, "MoE: the learner routes each token through the experts the sampler routed "
                                      "it to (R3: recorded by the engine, prompts included); needs a MoE model, "
                                      "an engine that records them (hf, hf_paged) and a rollout that keeps them "
                                      "(single_turn)")


class CriticConfig(Section):
    """The value model for PPO with GAE (`algo.advantage.name: gae`); not loaded otherwise."""

    model: str | None = opt(None, "critic body: a model path/name (default: a copy of the policy)")
    lr: float = opt(1e-5, "critic learning rate", gt=0)
    value_clip: float | None = opt(0.2, "clip value updates around the old values (None: off)", gt=0)
    grad_clip: float = opt(1.0, "clip the critic's gradient norm (0: off)", ge=0)


class OptimConfig(Section):
    lr: float = opt(2e-5, "peak learning rate (2e-5: at 5e-5 the default run collapsed for one seed in fp32)", gt=0)
    weight_decay: float = opt(0.0, "AdamW weight decay", ge=0)
    beta1: float = opt(0.9, "AdamW beta1")
    beta2: float = opt(0.99, "AdamW beta2")
    eps: float = opt(1e-8, "AdamW epsilon")
    state_dtype: Literal["auto", "float32", "bfloat16", "int8"] = opt(
        "auto", "AdamW moments' dtype (auto: int8 with bf16 weights, float32 with fp32 weights; int8: block-wise "
                "8-bit, log scale; bf16 weights are updated with stochastic rounding)")
    grad_clip: float = opt(1.0, "clip the global gradient norm to this (0: off)", ge=0)
    max_nonfinite_steps: int = opt(3, "optimiser steps with a NaN/inf gradient norm are skipped (weights and state "
                                      "untouched); this many in a row stop the run", ge=1)
    warmup_steps: int = opt(0, "linear warmup steps", ge=0)
    schedule: Literal["constant", "cosine", "linear"] = opt("constant", "learning-rate schedule after warmup")
    min_lr_ratio: float = opt(0.0, "cosine/linear: final lr as a fraction of the peak", ge=0, le=1)


class TrainConfig(Section):
    steps: int = opt(40, "training steps (one rollout batch each)", ge=1)
    updates_per_batch: int = opt(1, "optimiser steps per rollout batch (mini-batches x epochs)", ge=1)
    epochs_per_batch: int = opt(1, "passes over each rollout batch", ge=1)
    micro_batch_tokens: Annotated[int, Field(ge=16)] | Literal["auto"] = opt(
        "auto", "token budget (rows x longest row) of one forward/backward: bounds activation memory (without "
                "grad_checkpointing ~0.45 MiB a token for a 135M model in bf16; auto: 2048 on a CPU with >= 16 GiB, "
                "less with less memory; on a GPU 256 a free GiB as a power of two in 2048..16384)")
    logprob_chunk: Annotated[int, Field(ge=1)] | Literal["auto"] = opt(
        "auto", "rows of hidden states per LM-head chunk (bounds logits memory; auto: 256 on a CPU, 128 under "
                "8 GiB, 1024 on a big GPU)")
    precision: Literal["auto", "float32", "bfloat16"] = opt(
        "auto", "learner compute precision (auto: bfloat16 only where the CPU has native bf16 and a matmul "
                "measured it faster, or a GPU has bf16 tensor cores; else float32; see upslope doctor and model.dtype)")
    grad_checkpointing: bool | Literal["auto"] = opt(
        "auto", "keep only each decoder layer's input for backward and run the layer again there (works with "
                "share_prompt): activations no longer grow with the micro-batch, for about 1/3 more learner compute "
                "(auto: on on a CPU and on a GPU with under 24 GiB free, off otherwise)")
    lean_activations: bool = opt(True, "RMSNorm and SwiGLU MLP that keep fewer activations for backward (same "
                                       "values; Llama/Qwen/Mistral-style layers)")
    share_prompt: bool = opt(True, "forward each group's prompt once and share its KV cache across the group")
    packing: bool | Literal["auto"] = opt(
        "auto", "padding-free micro-batches: rows (each group's prompt once with share_prompt) packed into one "
                "sequence, attention within each row, so a micro-batch costs the tokens it has (true: every "
                "micro-batch, whose budget micro_batch_tokens then counts real tokens; auto: a micro-batch whose "
                "padding would fill a quarter or more of its token slots, the model permitting; false: padded)")
    skip_zero_advantage: bool = opt(True, "RL: no forward/backward for rows whose advantage is 0 on every token "
                                          "(their loss and gradient are exactly 0; needs no KL in the loss and "
                                          "no entropy bonus)")
    threads: int = opt(0, "torch threads (0: auto, fitted at each rollout to the cores that are free, so a core "
                          "another process keeps busy is left out; with deterministic: every usable core)", ge=0)
    seed: int = opt(0, "seed for data order, sampling and init (0 <= seed < 2**32: the data order's generator "
                       "takes seed x 7919 + epoch)", **SEED_RANGE)
    deterministic: bool = opt(False, "deterministic algorithms (bitwise-repeatable on CPU)")
    eval_every: int = opt(10, "evaluate every N steps (0: only before and after)", ge=0)
    eval_at: list[Annotated[int, Field(ge=1)]] = opt([], "also evaluate after these steps (e.g. the rungs of "
                                                         "upslope sweep)")
    eval_before: bool = opt(True, "evaluate before training")
    eval_after: bool = opt(True, "evaluate after training")
    save_every: int = opt(0, "checkpoint every N steps (0: only at the end)", ge=0)
    keep_last: int = opt(2, "checkpoints kept", ge=1)
    resume: str | None = opt(None, "'latest' or a checkpoint directory to resume from")
    stop_after: int | None = opt(None, "stop (with a checkpoint) after this many steps in this invocation", ge=1)


class AgentConfig(Section):
    """Multi-turn agents (rollout.kind=multi_turn): the environment, its tools and the turn limits."""

    env: Plugin = opt(Plugin(name="answer"), "environment each trajectory runs in (registry: environment)",
                      registry="environment")
    tools: list[Plugin] = opt([], "tools offered to the model (registry: tool), e.g. [{name: calculator}]; "
                                  "empty: the environment's own", registry="tool")
    tool_format: str = opt("hermes", "how the model writes tool calls and how they are parsed (registry: tool_format)",
                           registry="tool_format")
    max_turns: int = opt(4, "most model turns per trajectory", ge=1)
    max_turn_tokens: int | None = opt(None, "most tokens per model turn (default: what is left of rollout.max_new_tokens, "
                                            "which bounds each trajectory's model and tool tokens together)", ge=1)
    tool_timeout_s: float = opt(10.0, "wall-clock limit of one tool call; past it the model gets a timeout message "
                                      "(the python tool has its own, shorter limit inside the sandbox)", gt=0)
    tool_output_chars: int = opt(400, "tool results longer than this are cut (the model sees a truncation note)", ge=16)
    sft_coef: float = opt(0.0, "weight of the interleaved SFT term on valid tool-call turns of successful "
                               "trajectories (0: off)", ge=0)
    hint_decay: float = opt(0.5, "reward parts earned after k guidance hints are multiplied by hint_decay**k",
                            ge=0, le=1)

    @field_validator("tools")
    @classmethod
    def _each_tool_once(cls, tools: list[Plugin]) -> list[Plugin]:
        """The model calls a tool by name, so a second entry of one tool would silently replace the first."""
        names = [t.name for t in tools]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"tool {twice[0]!r} is listed twice; give each tool once (with all its options)")
        return tools


# what an evaluation source takes from the training source unless eval.data sets it: how records read
INHERITED_DATA_FIELDS = ("prompt_field", "messages_field", "answer_field", "system_prompt", "template")


class EvalConfig(Section):
    data: DataConfig | None = opt(None, "held-out prompts: a data section, or just a file path (eval.data=test.jsonl); "
                                        "the field mapping it leaves unset (prompt_field, messages_field, "
                                        "answer_field, system_prompt, template) is the training data's (default: "
                                        "the training task's test split, 200 problems; a single training file has "
                                        "none, so the file itself, with a warning)")
    n: int = opt(1, "samples per prompt", ge=1)
    temperature: float = opt(0.0, "0 means greedy", ge=0)
    top_p: float = opt(1.0, "nucleus sampling mass", gt=0, le=1)
    max_new_tokens: int | None = opt(None, "default: rollout.max_new_tokens", ge=1)
    k: list[int] = opt([1], "pass@k / maj@k values to report (each <= n)")
    limit: int | None = opt(200, "evaluate on the first N prompts", ge=1)
    confidence_pattern: str | None = opt(None, "regex of a stated confidence (group 1 the number, group 2 an "
                                               "optional %); set: also report ece, brier and confidence_stated "
                                               "(a reply stating none counts as confidence 1)")
    abstain_pattern: str | None = opt(None, "regex marking a reply as an abstention; set: also report coverage, "
                                            "selective_risk and aurc (answers ranked by mean token log-prob, "
                                            "abstentions last)")
    write_samples: bool = opt(True, "write every completion and its reward to samples.jsonl")

    @field_validator("data", mode="before")
    @classmethod
    def _path_alone(cls, data: Any) -> Any:
        """`eval.data=test.jsonl`: a path alone is the data section's `path`."""
        return {"path": data} if isinstance(data, str) else data

    @field_validator("confidence_pattern", "abstain_pattern")
    @classmethod
    def _regex(cls, pattern: str | None) -> str | None:
        """A pattern Python's re compiles (checked before any sample is generated)."""
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"not a regular expression ({exc})") from None
        return pattern

    @field_validator("k")
    @classmethod
    def _k_within_n(cls, k: list[int], info: Any) -> list[int]:
        n = info.data.get("n", 1)
        bad = [v for v in k if v > n or v < 1]
        if bad:
            raise ValueError(f"{bad} not in 1..eval.n={n} (sample more with eval.n=...)")
        return k


class LogConfig(Section):
    jsonl: bool = opt(True, "write metrics.jsonl (and the completion tables, rollouts.jsonl) in the run directory")
    tensorboard: bool = opt(True, "also write TensorBoard events when tensorboard is installed")
    trackers: list[Plugin] = opt([], "experiment trackers (registry: tracker), e.g. [wandb, mlflow] or "
                                     "[{name: wandb, options: {project: p, mode: offline}}]: wandb, trackio, "
                                     "mlflow, tensorboard", registry="tracker")
    table_every: int = opt(10, "every N steps, a table of sampled prompts, completions and rewards to the trackers "
                               "and rollouts.jsonl (0: none)", ge=0)
    table_rows: int = opt(16, "samples in each completion table (the step's first groups)", ge=1)
    progress: bool = opt(True, "live progress display")
    plot: bool = opt(True, "write reward/accuracy plots (PNG) at the end")

    @field_validator("trackers", mode="before")
    @classmethod
    def _tracker_names(cls, v: Any) -> Any:
        """A tracker may be named alone (`log.trackers=[wandb]`): a plugin with no options."""
        return [{"name": t} if isinstance(t, str) else t for t in v] if isinstance(v, list) else v


class LoraConfig(Section):
    enabled: bool = opt(False, "train a LoRA adapter (PEFT) instead of every weight; works for every trainer")
    rank: int = opt(16, "adapter rank r (B @ A has rank r)", ge=1)
    alpha: float = opt(32.0, "adapter scale numerator: the weight update is (alpha / rank) * B @ A", gt=0)
    dropout: float = opt(0.0, "dropout on the adapter's input while training (0: off)", ge=0, lt=1)
    target_modules: list[str] | Literal["auto", "all-linear"] = opt(
        "auto", "linear layers to adapt, by name; auto: the model's attention and MLP projections as its "
                "architecture names them (every linear layer but the LM head and MoE routers); 'all-linear' "
                "adds the routers")

    @field_validator("target_modules", mode="before")
    @classmethod
    def _targets(cls, v: Any) -> Any:
        ok = v in ("auto", "all-linear") or (isinstance(v, list) and v and len(set(v)) == len(v)
                                   and all(isinstance(x, str) and x.strip() for x in v))
        if not ok:
            raise ValueError("expected a non-empty list of distinct module names, e.g. [q_proj, v_proj], 'auto' or "
                             "'all-linear'")
        return v


class Config(Section):
    plugins: list[str] = opt([], "user plugin modules imported before the config is checked: dotted module "
                                 "names or .py files (a recipe's relative paths are relative to the recipe)")
    run_dir: str = opt("runs/default", "output directory: metrics, samples, checkpoints")
    model: ModelConfig = opt_factory(ModelConfig, "policy model")
    engine: EngineConfig = opt_factory(EngineConfig, "rollout engine")
    data: DataConfig = opt_factory(DataConfig, "training prompts")
    rollout: RolloutConfig = opt_factory(RolloutConfig, "sampling during training")
    reward: list[RewardSpec] = opt([], "reward components (empty: the task's default reward)", registry="reward")
    reward_fallback: float = opt(0.0, "reward for a sample whose reward function raised or returned NaN")
    algo: AlgoConfig = opt_factory(AlgoConfig, "algorithm: advantage, loss, KL, filters")
    optim: OptimConfig = opt_factory(OptimConfig, "optimiser and schedule")
    critic: CriticConfig = opt_factory(CriticConfig, "value model for PPO (used by the gae advantage)")
    train: TrainConfig = opt_factory(TrainConfig, "training loop")
    agent: AgentConfig = opt_factory(AgentConfig, "multi-turn agents with tools (rollout.kind=multi_turn)")
    eval: EvalConfig = opt_factory(EvalConfig, "evaluation")
    log: LogConfig = opt_factory(LogConfig, "metric sinks and progress")
    distill: DistillConfig = opt_factory(DistillConfig, "on-policy distillation: teacher and loss (upslope distill)")
    sft: SFTConfig = opt_factory(SFTConfig, "supervised fine-tuning (upslope sft; the loss is shared by rft)")
    rft: RFTConfig = opt_factory(RFTConfig, "rejection-sampling fine-tuning (upslope rft)")
    dpo: DPOConfig = opt_factory(DPOConfig, "preference optimisation (upslope dpo)")
    rm: RMConfig = opt_factory(RMConfig, "reward-model training (upslope rm)")
    randopt: RandOptConfig = opt_factory(RandOptConfig, "gradient-free weight-space search: RandOpt / ES / CoRP "
                                                        "(upslope randopt)")
    lora: LoraConfig = opt_factory(LoraConfig, "LoRA adapter training (PEFT) for every trainer")
    dist: DistConfig = opt_factory(DistConfig, "sharded learner across processes (DDP / FSDP2) and rollout "
                                               "workers on Ray")
    pipeline: PipelineConfig = opt_factory(PipelineConfig, "asynchronous rollout -> learner pipeline (staleness, "
                                                           "partial groups, streaming)")
    _auto: dict[str, Any] = PrivateAttr(default_factory=dict)  # the values `auto` chose here (auto_choices())
    _prompt_budget_set: bool = PrivateAttr(default=True)  # rollout.max_prompt_tokens given, not defaulted

    @field_validator("plugins", mode="before")
    @classmethod
    def _import_plugins(cls, v: Any) -> Any:
        """Import the user's plugin modules first (`plugins` is the first field), however the Config is made."""
        from upslope.plugins import import_plugins

        import_plugins(v)
        return v

    @model_validator(mode="after")
    def _task_defaults(self) -> "Config":
        if self.rollout.max_new_tokens is None:
            self.rollout.max_new_tokens = task_generation_length(self.data)
        if self.rollout.max_prompt_tokens is None:  # fitted to the model's context once it is known
            self.rollout.max_prompt_tokens = DEFAULT_PROMPT_TOKENS
            self._prompt_budget_set = False
        self._auto = {**self._auto, **_resolve_auto(self)}  # also runs on assignment: keep earlier choices
        self._bound_stale_samples()
        self._inherit_eval_mapping()
        if self.train.precision == "float32" and self.model.dtype != "float32":
            raise ValueError(f"train.precision float32 needs float32 weights, but model.dtype is {self.model.dtype}")
        return self

    def _bound_stale_samples(self) -> None:
        """With max_staleness > 0, samples come from weights up to that many versions old; with one update per
        batch the ratio against the learner's own log-probs is 1, so nothing would bound their update
        (max_staleness=2 lost 15-25 points of held-out accuracy; docs/distributed.md). Options set by hand win."""
        stale = self.pipeline.max_staleness > 0
        if self.algo.old_policy == "auto":
            self.algo.old_policy = "sampler" if stale and self.pipeline.stale_correction == "clip" else "learner"
        if stale and self.pipeline.stale_correction == "token" and self.algo.correction is None:
            self.algo.correction = CorrectionConfig(level="token", cap=2.0)

    def _inherit_eval_mapping(self) -> None:
        """eval.data reads its records as the training data does (INHERITED_DATA_FIELDS) unless it says
        otherwise: a chat file trained with data.messages_field is evaluated through its chats too. The
        fields taken count as set, so the saved config (and a config loaded from it) keeps them."""
        ev = self.eval.data
        if ev is None:
            return
        taken = {k: getattr(self.data, k) for k in INHERITED_DATA_FIELDS if k not in ev.model_fields_set}
        if taken:
            self.eval.data = ev.model_copy(update=taken)

    def __eq__(self, other: object) -> bool:
        """Equal options are equal configs, however they were reached (`auto` or written out)."""
        return type(other) is type(self) and self.__dict__ == other.__dict__

    __hash__ = None  # type: ignore[assignment]

    @property
    def prompt_budget_is_default(self) -> bool:
        """rollout.max_prompt_tokens was left unset (so it may be fitted to a shorter model context)."""
        return not self._prompt_budget_set

    def auto_choices(self) -> dict[str, Any]:
        """{dotted key: value} for each option this config left at `auto` and the machine decided."""
        return dict(self._auto)


# options whose `auto` is decided from the hardware (upslope.hardware.choose_defaults)
AUTO_KEYS = ("train.precision", "model.dtype", "engine.dtype", "train.micro_batch_tokens", "train.logprob_chunk",
             "train.grad_checkpointing")


def _resolve_auto(cfg: Config) -> dict[str, Any]:
    """Replace each `auto` of AUTO_KEYS by what this machine calls for; explicit values stay."""
    if not any(_get(cfg, k) == "auto" for k in AUTO_KEYS):
        return {}
    from upslope.hardware import machine_defaults, weights_dtype

    d = machine_defaults()
    applied: dict[str, Any] = {}

    def put(key: str, value: Any) -> None:
        if _get(cfg, key) == "auto":
            section, name = key.split(".")
            setattr(getattr(cfg, section), name, value)
            applied[key] = value

    put("train.precision", d.precision)
    put("model.dtype", weights_dtype(cfg.train.precision, d.on_gpu))
    # an engine that generates with a private copy of the policy (hf, hf_paged) keeps the weights' dtype on a
    # CPU (its log-probs are then the learner's); on a GPU every engine generates in the precision (bf16)
    put("engine.dtype", cfg.model.dtype if _copies_policy(cfg.engine.name, d.engine_name) and not d.on_gpu
        else d.engine_dtype)
    put("train.micro_batch_tokens", d.micro_batch_tokens)
    put("train.logprob_chunk", d.logprob_chunk)
    put("train.grad_checkpointing", d.grad_checkpointing)
    return applied


def _copies_policy(name: str, auto_name: str) -> bool:
    """Whether the engine `name` (auto: `auto_name`) generates with a copy of the policy's weights (its
    registration says `copies_policy=True`); an unknown name is reported later, with the other names."""
    from upslope.registry import ENGINES

    try:
        return bool(ENGINES.get(auto_name if name == "auto" else name).traits.copies_policy)
    except ConfigError:
        return False


def _get(cfg: Config, key: str) -> Any:
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


# ---------------------------------------------------------------- loading


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read a YAML recipe (which may name a `base:` recipe to extend) and apply
    `a.b.c=value` overrides; validate into a Config."""
    defaults = Config().model_dump(mode="json")
    defaults["rollout"]["max_new_tokens"] = None  # derived from the task after merging
    defaults["rollout"]["max_prompt_tokens"] = None  # 512, or fitted to the model's context at run time
    defaults["algo"]["old_policy"] = "auto"  # derived from the pipeline after merging (_bound_stale_samples)
    for key in AUTO_KEYS:  # decided from the hardware after merging (explicit values win)
        section, name = key.split(".")
        defaults[section][name] = "auto"
    raw: dict[str, Any] = merge(defaults, read_recipe(Path(path)) if path else {})
    for item in overrides or []:
        apply_override(raw, item)
    if isinstance(raw.get("plugins"), list):  # command-line plugin files: relative to the working directory
        raw["plugins"] = absolute_plugin_files(raw["plugins"], Path.cwd())
    return validate(raw, source=str(path) if path else "config")


def validate(raw: dict[str, Any], source: str = "config") -> Config:
    """Validate `raw` into a Config (its `plugins` imported first) whose plugin names all exist."""
    check_moved(raw, source)
    try:
        cfg = Config.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {describe(exc, Config)}") from None
    check_plugin_names(cfg, source)
    check_idle_options(cfg, source)
    return cfg


def eval_generation_length(cfg: Config) -> int:
    """The reply length of evaluation: eval.max_new_tokens, else eval.data's task's (when eval.data is
    set), else rollout.max_new_tokens."""
    ev = cfg.eval
    if ev.max_new_tokens:
        return ev.max_new_tokens
    return task_generation_length(ev.data) if ev.data is not None else int(cfg.rollout.max_new_tokens or 0)


def task_generation_length(data: DataConfig, fallback: int = 256) -> int:
    """The completion length a built-in task suggests (its registry entry's max_new_tokens)."""
    if data.path:
        return fallback
    from upslope.registry import TASKS

    return int(TASKS.get(data.task, "data.task").traits.max_new_tokens or fallback)


def dump(config: Config) -> str:
    """The resolved config as YAML."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


def describe_options(model: type[BaseModel] | None = None, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, default, help) for every option of `model` (the whole config by default),
    for `upslope config options` and docs/options.md."""
    return option_rows(model or Config, prefix, leaves=(Plugin, RewardSpec))
