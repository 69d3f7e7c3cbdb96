"""The fallback engine: transformers `generate`, batched with left padding."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

import torch

from upslope.registry import ENGINES
from upslope.hardware import fit_threads
from upslope.models import attention_for
from upslope.rollout.base import Completion, Engine, SamplingParams

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
        stops = params.stop_token_ids or [self.tokenizer.eos_token_id]
        out = self.model.generate(
            input_ids=ids.to(self.device), attention_mask=attn.to(self.device), max_new_tokens=params.max_new_tokens,
            do_sample=not greedy, temperature=None if greedy else params.temperature,
            top_p=None if greedy else params.top_p, top_k=None if greedy else params.top_k,  # 0 turns off HF's default top-k of 50
            num_return_sequences=n_return, eos_token_id=stops, pad_token_id=self.pad_id,
            output_scores=True, return_dict_in_generate=True,
        )
        new = out.sequences[:, width:].cpu()
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
            completions.append(Completion(toks, token_lp[row, :len(toks)].tolist(),
                                          self.tokenizer.decode(toks, skip_special_tokens=True), finish))
        return [completions[i * params.n:(i + 1) * params.n] for i in range(len(prompts))]

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.model.named_parameters(remove_duplicate=False))  # tied names too (lm_head)
        for name, tensor in named_tensors:
            params[name].copy_(tensor)
        self.version += 1


@ENGINES.register("hf", auto_rank=1, copies_policy=True)
def build_hf(cfg: EngineConfig, ctx: EngineContext) -> Engine:
    """transformers `generate` on a private copy of the policy: needs nothing more (engine.hf_batch_size)."""
    return HFEngine(ctx.model_path, ctx.tokenizer, dtype=ctx.model_dtype if cfg.dtype == "auto" else cfg.dtype,
                    batch_size=cfg.hf_batch_size, threads=ctx.threads, device=ctx.device,
                    trust_remote_code=ctx.trust_remote_code)
