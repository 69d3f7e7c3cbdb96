"""The fallback engine: transformers `generate`, batched with left padding. For a MoE model it can
also return the experts each token was routed to (`SamplingParams.routed_experts`, recorded from the
routers as `generate` runs: the prompts' forward, then one forward per new token)."""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Iterable

import torch

from upslope import routing
from upslope.errors import UpslopeError
from upslope.registry import ENGINES
from upslope.hardware import fit_threads
from upslope.models import attention_for
from upslope.engine import Completion, Engine, SamplingParams

if TYPE_CHECKING:
    from upslope.config import EngineConfig
    from upslope.rollout.engines import EngineContext


class HFEngine(Engine):
    """Runs a private copy of the policy with HF `generate`; needs nothing beyond transformers."""

    name = "hf"

    def __init__(self, model_path: str, tokenizer: Any, dtype: str = "float32", batch_size: int = 64,
                 threads: int = 0, device: str = "cpu", trust_remote_code: bool = False):
        from upslope.models import load_model

        self.device = str(device)
        self.model = load_model(model_path, dtype, trust_remote_code,
                                attn_implementation=attention_for(self.device)).to(self.device).eval()
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.pad_id = tokenizer.pad_token_id
        self.threads = threads  # > 0: fixed; 0: fitted to the free cores before each generation

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        results: list[list[Completion]] = []
        fit_threads(self.threads)
        with torch.random.fork_rng(devices=[self.device] if self.device != "cpu" else []):
            if params.seed is not None:
                torch.manual_seed(params.seed)
            for start in range(0, len(prompts), self.batch_size):
                results.extend(self._generate_batch(prompts[start:start + self.batch_size], params))
        return results

    def _generate_batch(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.as_tensor(p)
            attn[i, width - len(p):] = 1
        greedy = params.temperature == 0
        n_return = params.n
        if greedy and params.n > 1:  # HF refuses num_return_sequences > 1 without sampling: repeat the rows
            ids, attn, n_return = ids.repeat_interleave(params.n, 0), attn.repeat_interleave(params.n, 0), 1
        stops = [-1] if params.ignore_eos else params.stop_token_ids or [self.tokenizer.eos_token_id]
        watch = routing.recording(self.model) if params.routed_experts else contextlib.nullcontext()
        with watch as recorded:
            out = self.model.generate(
                input_ids=ids.to(self.device), attention_mask=attn.to(self.device),
                max_new_tokens=params.max_new_tokens, do_sample=not greedy,
                temperature=None if greedy else params.temperature, top_p=None if greedy else params.top_p,
                top_k=None if greedy else params.top_k,  # 0 turns off HF's default top-k of 50
                num_return_sequences=n_return, eos_token_id=stops, pad_token_id=self.pad_id,
                output_scores=True, return_dict_in_generate=True,
            )
        new = out.sequences[:, width:].cpu()
        routed = _routed_columns(recorded, new.shape[0], width, len(out.scores)) if recorded is not None else None
        # scores are the processed logits the sampler drew from (temperature, top-p/k applied)
        logps = torch.stack([torch.log_softmax(s.float(), dim=-1) for s in out.scores], dim=1)
        token_lp = logps.gather(-1, out.sequences[:, width:].unsqueeze(-1)).squeeze(-1).cpu()
        stop_set = set(stops)
        completions = []
        for row in range(new.shape[0]):
            toks = new[row].tolist()
            end = next((i + 1 for i, t in enumerate(toks) if t in stop_set), None)
            finish = "stop" if end is not None else "length"
            toks = toks[:end] if end is not None else toks
            experts = None
            if routed is not None:  # the prompt's tokens (right of its left padding), then the completion's
                plen = len(prompts[row // params.n])
                experts = routed[row, width - plen:width + len(toks)]
            completions.append(Completion(toks, token_lp[row, :len(toks)].tolist(),
                                          self.tokenizer.decode(toks, skip_special_tokens=True), finish, experts))
        return [completions[i * params.n:(i + 1) * params.n] for i in range(len(prompts))]

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.model.named_parameters(remove_duplicate=False))  # tied names too (lm_head)
        for name, tensor in named_tensors:
            params[name].copy_(tensor)
        self.version += 1


def _routed_columns(recorded: routing.Recording, rows: int, width: int, steps: int) -> torch.Tensor:
    """[rows, width + steps, MoE layers, K]: the experts each column of `generate`'s sequences was routed to,
    from its router calls: the left-padded prompts' forward ([rows x width] tokens), then one per new token
    but the last (which is never run through the model: NOT_ROUTED)."""
    calls = len(recorded.calls[0]) if recorded.calls else 0
    if calls != steps:
        raise UpslopeError(f"engine hf: {calls} forwards recorded for {steps} generated tokens; cannot place the "
                           f"routed experts")
    first = recorded.stacked(0)
    layers, k = first.shape[1:]
    columns = [first.view(rows, width, layers, k)] + [recorded.stacked(c).view(rows, 1, layers, k) for c in range(1, calls)]
    last = torch.full((rows, 1, layers, k), routing.NOT_ROUTED, dtype=first.dtype, device=first.device)
    return torch.cat(columns + [last], 1).to(routing.EXPERT_DTYPE).cpu()


@ENGINES.register("hf", auto_rank=1, copies_policy=True, routed_experts=True)
def build_hf(cfg: EngineConfig, ctx: EngineContext) -> Engine:
    """transformers `generate` on a private copy of the policy: needs nothing more (engine.hf_batch_size)."""
    return HFEngine(ctx.model_path, ctx.tokenizer, dtype=ctx.model_dtype if cfg.dtype == "auto" else cfg.dtype,
                    batch_size=cfg.hf_batch_size, threads=ctx.threads, device=ctx.device,
                    trust_remote_code=ctx.trust_remote_code)
