"""transformers' continuous batching: a paged KV cache filled by a scheduler that admits new
sequences as others finish, instead of `generate`'s padded batches that run until their longest
row ends. Needs nothing beyond transformers (5.x), runs on the CPU and on a GPU, and returns the
sampler's own log-probs (the log-softmax of the processed logits it drew from).

One `generate` call is one continuous-batching session: the manager and its KV cache exist for the
call only, so a colocated learner gets the memory back between rollouts and no cached prefix
outlives a weight update. A prompt's `n` completions are `n` requests of the same prompt (within a
call its full pages are shared); transformers 5.17 returns no forked children for
`num_return_sequences`, so the engine does not ask for them.

For a MoE model it can also return the experts each token was routed to (`SamplingParams.routed_experts`):
each forward packs tokens of several requests, so the routers' picks are placed by the requests the
scheduler put in that forward (their ids, first positions and token counts), then back in input order; a
prompt page another request of the same prompt had already filled (prefix sharing) takes that request's
routing, which the same tokens in the same context gave. The session then runs synchronously, without
CUDA graphs (whose replays would run no router code to record)."""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from typing import TYPE_CHECKING, Any, Iterator

import torch

from upslope import routing
from upslope.bounds import Count, PositiveFraction
from upslope.engine import Completion, SamplingParams
from upslope.errors import UpslopeError
from upslope.hardware import fit_threads
from upslope.registry import ENGINES
from upslope.rollout.hf import HFEngine

if TYPE_CHECKING:
    from upslope.config import EngineConfig
    from upslope.rollout.engines import EngineContext

PAGE_TOKENS = 256  # tokens a cache page holds (transformers' default)


class PagedEngine(HFEngine):
    """A private copy of the policy generating with transformers' `generate_batch` (continuous
    batching, paged attention); weights are updated in place as in the `hf` engine."""

    name = "hf_paged"

    def __init__(self, model_path: str, tokenizer: Any, dtype: str = "float32", threads: int = 0,
                 device: str = "cpu", max_batch_tokens: int = 0, memory_fraction: float = 0.9,
                 cuda_graphs: bool = True, trust_remote_code: bool = False):
        super().__init__(model_path, tokenizer, dtype=dtype, threads=threads, device=device,
                         trust_remote_code=trust_remote_code)
        on_gpu = self.device.startswith("cuda")
        self.max_batch_tokens = max_batch_tokens or (8192 if on_gpu else 1024)
        self.memory_fraction = memory_fraction
        self.cuda_graphs = cuda_graphs and on_gpu
        # transformers warns once per request that samples a token past its limit: keep logs clean
        logging.getLogger("transformers.generation.continuous_batching").setLevel(logging.ERROR)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        if not prompts:
            return []
        from transformers import GenerationConfig

        fit_threads(self.threads)
        greedy = params.temperature == 0
        inputs = [list(p) for p in prompts for _ in range(params.n)]
        stops = [-1] if params.ignore_eos else list(params.stop_token_ids) or [self.tokenizer.eos_token_id]
        config = GenerationConfig(
            max_new_tokens=params.max_new_tokens, do_sample=not greedy,
            temperature=None if greedy else params.temperature, top_p=None if greedy else params.top_p,
            top_k=None if greedy else params.top_k,  # 0 turns off transformers' default top-k of 50
            eos_token_id=stops, pad_token_id=self.pad_id)
        need = len(inputs) * math.ceil((max(map(len, inputs)) + params.max_new_tokens) / PAGE_TOKENS)
        seed = params.seed if params.seed is not None else int(torch.randint(0, 2**31 - 1, ()).item())
        capture = params.routed_experts
        watch = _routing_by_request(self.model) if capture else contextlib.nullcontext()
        with torch.random.fork_rng(devices=[self.device] if self.device != "cpu" else []), watch as routed:
            outs = self.model.generate_batch(inputs, generation_config=config,
                                             continuous_batching_config=self._batching_config(need + 2, seed, capture),
                                             progress_bar=False)
        rows = list(outs.values())  # in input order
        failed = [r for r in rows if r.error is not None]
        if len(rows) != len(inputs) or failed:
            reason = failed[0].error if failed else f"{len(inputs) - len(rows)} of {len(inputs)} sequences missing"
            raise UpslopeError(f"engine hf_paged: continuous batching failed ({reason})")
        stop_set = set(stops)
        completions = [self._completion(r, stop_set, params.max_new_tokens) for r in rows]
        if routed is not None:
            for comp, row, prompt in zip(completions, rows, inputs):
                comp.routed_experts = routed.of(row.request_id, prompt, len(comp.token_ids))
        return [completions[i * params.n:(i + 1) * params.n] for i in range(len(prompts))]

    def _batching_config(self, blocks: int, seed: int, routing_capture: bool = False) -> Any:
        """The session's ContinuousBatchingConfig: a cache of `blocks` pages (what the batch needs; fewer
        if memory allows fewer) and the sampler's log-probs, with the field names this transformers has;
        when the routers' picks are recorded, synchronous and without CUDA graphs."""
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        fields = {f.name for f in dataclasses.fields(ContinuousBatchingConfig)}
        want: dict[str, Any] = {"return_logprobs": True, "seed": seed, "max_batch_tokens": self.max_batch_tokens,
                                "num_blocks": blocks, "max_memory_percent": self.memory_fraction,
                                "use_cuda_graph": self.cuda_graphs and not routing_capture}
        if routing_capture:
            want["use_async_batching"] = False
        want["page_size" if "page_size" in fields else "block_size"] = PAGE_TOKENS
        return ContinuousBatchingConfig(**{k: v for k, v in want.items() if k in fields})

    def _completion(self, out: Any, stops: set[int], max_new_tokens: int) -> Completion:
        toks = list(out.generated_tokens)
        end = next((i + 1 for i, t in enumerate(toks) if t in stops), None)
        toks = toks[:end] if end is not None else toks[:max_new_tokens]
        logps = [float(x) for x in out.logprobs[:len(toks)]]
        if len(logps) != len(toks):
            raise UpslopeError(f"engine hf_paged: {len(toks)} tokens but {len(logps)} log-probs returned")
        finish = "stop" if end is not None else "length"
        return Completion(toks, logps, self.tokenizer.decode(toks, skip_special_tokens=True), finish)


class RequestRouting:
    """The experts the routers picked for each request's tokens, by position, from the forwards of one
    continuous-batching session."""

    def __init__(self) -> None:
        self.by_request: dict[str, dict[int, torch.Tensor]] = {}  # request id -> position -> [MoE layers, K]
        self.prompts: dict[str, tuple[int, ...]] = {}  # request id -> its prompt's tokens

    def add(self, layout: list[tuple[str, int, int]], picks: torch.Tensor) -> None:
        """One forward: its requests in order (id, first position, tokens) and the picks of its tokens
        ([tokens, MoE layers, K], in the same order)."""
        if picks.shape[0] != sum(n for _, _, n in layout):
            raise UpslopeError(f"engine hf_paged: a forward routed {picks.shape[0]} tokens for "
                               f"{sum(n for _, _, n in layout)} scheduled; cannot place the routed experts")
        at = 0
        for request, first, count in layout:
            positions = self.by_request.setdefault(request, {})
            for i in range(count):
                positions[first + i] = picks[at + i]
            at += count

    def of(self, request: str, prompt: list[int], completion_tokens: int) -> torch.Tensor:
        """[prompt + completion tokens, MoE layers, K] for `request`: its own picks, prompt positions it did
        not run taken from a request of the same prompt that did, NOT_ROUTED where no forward ran the token
        (its last one)."""
        own = self.by_request.get(request, {})
        shape = next(iter(own.values())).shape
        out = torch.full((len(prompt) + completion_tokens, *shape), routing.NOT_ROUTED, dtype=routing.EXPERT_DTYPE)
        for position, picks in own.items():
            if position < out.shape[0]:
                out[position] = picks
        missing = [p for p in range(len(prompt)) if p not in own]
        if missing:
            twin = next((r for r, pos in self.by_request.items() if r != request and all(p in pos for p in missing)
                         and self.prompts.get(r) == tuple(prompt)), None)
            if twin is None:
                raise UpslopeError(f"engine hf_paged: no forward ran {len(missing)} prompt tokens of {request}")
            for p in missing:
                out[p] = self.by_request[twin][p]
        return out


@contextlib.contextmanager
def _routing_by_request(model: Any) -> Iterator[RequestRouting]:
    """Within the block (one `generate_batch` session), each continuous-batching forward's router picks are
    placed by the requests the scheduler put in it."""
    from transformers.generation.continuous_batching.continuous_api import ContinuousBatchProcessor

    placed = RequestRouting()
    original = ContinuousBatchProcessor._generation_step

    def step(processor: Any, model_: Any) -> None:
        batch = processor.inputs_and_outputs.requests_in_batch
        layout = [(f.state.request_id, f.state.position_offset - f.query_length, f.query_length) for f in batch]
        for f in batch:
            placed.prompts.setdefault(f.state.request_id, tuple(f.state.initial_tokens))
        before = len(recorded.calls[0])
        original(processor, model_)
        if len(recorded.calls[0]) != before + 1:
            raise UpslopeError("engine hf_paged: a forward did not run each router once; cannot place the routed experts")
        placed.add(layout, recorded.stacked(before).to(routing.EXPERT_DTYPE).cpu())

    with routing.recording(model) as recorded:
        ContinuousBatchProcessor._generation_step = step
        try:
            yield placed
        finally:
            ContinuousBatchProcessor._generation_step = original


# the layer kinds transformers' paged cache holds (its allocators: one per kind)
PAGED_LAYER_TYPES = ("full_attention", "sliding_attention")


def paged_model_check(model_path: str) -> str | None:
    """Why transformers' continuous batching cannot run the model at `model_path`, or None. Its paged cache
    holds keys and values of one head size per layer for full and sliding-window attention only: not multi-head
    latent attention (DeepSeek-V2/V3, Kimi-K2: a compressed latent and a separate rotary key), not chunked
    attention (Llama 4) and not the recurrent state of a hybrid's Mamba, convolution or linear-attention layers
    (LFM2, Qwen3-Next, Granite 4, Falcon-H1)."""
    import json
    from pathlib import Path

    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return None  # the model's own loading reports what it cannot read
    if not isinstance(config, dict):
        return None
    archs = ", ".join(config.get("architectures") or []) or "this model"
    cannot = "which transformers' paged cache cannot hold"
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    if text.get("kv_lora_rank"):
        return f"{archs} uses multi-head latent attention, whose keys and values transformers' paged cache cannot hold"
    recurrent = _recurrent_layers(model_path)
    if recurrent:
        return f"{archs} has {recurrent} recurrent layer{'s' if recurrent > 1 else ''} (state-space, convolution or " \
               f"linear attention), {cannot}"
    other = sorted({t for t in text.get("layer_types") or [] if t not in PAGED_LAYER_TYPES})
    if other:
        return f"{archs} has {', '.join(other)} layers, {cannot}"
    return None


def _recurrent_layers(model_path: str) -> int:
    """`recurrent_layer_count` of the model's config (0 where transformers cannot read it without remote code)."""
    from transformers import AutoConfig

    from upslope.models import recurrent_layer_count

    try:
        config = AutoConfig.from_pretrained(model_path)
    except Exception:  # remote code or an unknown type: its own loading reports that
        return 0
    return recurrent_layer_count(config)


@ENGINES.register("hf_paged", copies_policy=True, routed_experts=True, model_check=paged_model_check)
def build_hf_paged(cfg: EngineConfig, ctx: EngineContext, *, max_batch_tokens: Count = 0,
                   memory_fraction: PositiveFraction = 0.9, cuda_graphs: bool = True) -> PagedEngine:
    """transformers' continuous batching with paged attention (generate_batch): CPU or GPU, no extra package.

    max_batch_tokens: tokens per forward (0: 8192 on a GPU, 1024 on a CPU)
    memory_fraction: most of the free GPU memory its KV cache may take
    cuda_graphs: replay captured CUDA graphs (GPU only; 1.6-2.5x faster than without on an H200)
    """
    return PagedEngine(ctx.model_path, ctx.tokenizer, dtype=ctx.model_dtype if cfg.dtype == "auto" else cfg.dtype,
                       threads=ctx.threads, device=ctx.device, max_batch_tokens=max_batch_tokens,
                       memory_fraction=memory_fraction, cuda_graphs=cuda_graphs, trust_remote_code=ctx.trust_remote_code)
