"""MoE routing in the learner and the HF engine, on tiny random-init models of each MoE family
(upslope.families: 4 experts, 2 per token, 2 layers, SmolLM2's tokenizer):
- the load-balancing loss the learner returns equals transformers' own (`output_router_logits`, and its
  `load_balancing_loss_func` on the same forward's router logits), in every learner path, and its
  gradient reaches the routers;
- routing replay: the HF engine records the experts each token was routed to (prompt and completion),
  and the learner's forward runs exactly those experts (read at the experts' input, a place the
  replay does not touch) in every path, with the sampler's log-probs; after a large update of the routers
  the learner's own routing differs, replay still runs the recorded experts weighted by the current
  router as the family weighs them (checked against the experts forced by hand, with each family's
  weighting written out here) and stays closer to the sampler, and the routers get the same gradient as
  through the experts forced by hand;
- a router that does not pick with one top-k (PhiMoE's sparsemixer) is refused in one line."""
from __future__ import annotations

from typing import Any

import pytest
import torch

from family_checks import PAGED_REFUSED, families, run_marks

from upslope import routing
from upslope.batch import Batch
from upslope.families import FAMILIES, make_family_model
from upslope.models import load_model, load_tokenizer
from upslope.train.learner.logprobs import fast_head_matches, token_scores
from upslope.train.learner.mixers import recurrent_layers

pytestmark = pytest.mark.usefixtures("one_torch_thread")
MOE = [name for name, family in FAMILIES.items() if family.moe]
# PhiMoE's sparsemixer picks its two experts by two masked maxima, not one top-k: refused in one line
NOT_ROUTED = {"phimoe"}
ROUTED = [name for name in MOE if name not in NOT_ROUTED]
PAGED = [name for name in ROUTED if name not in PAGED_REFUSED]  # what continuous batching runs
# the three router kinds (softmax top-k, sigmoid with group choice, softmax over the picked experts) run the
# engine and gradient checks in the default run; the other families in CI's slow set
ROUTING_DEFAULT = {"qwen3_moe", "deepseek_v3", "gpt_oss"}


def by_router_kind(names: list[str]) -> list[Any]:
    """`names` as pytest parameters, those outside ROUTING_DEFAULT marked for CI's slow set."""
    return [pytest.param(n, marks=run_marks(n, ROUTING_DEFAULT)) for n in names]


MODES = {"rows": {}, "shared prompt": {"shared": True}, "checkpointed layers": {"checkpoint_layers": True},
         "shared + checkpointed": {"shared": True, "checkpoint_layers": True}}


@pytest.fixture(scope="session")
def moe_path(smollm_path, tmp_path_factory):
    root = tmp_path_factory.mktemp("moe-families")

    def build(name: str) -> str:
        return make_family_model(name, smollm_path, root / name)
    return build


@pytest.fixture(scope="module")
def sampled(moe_path):
    """Per family: a batch sampled by the HF engine with its routed experts (3 prompts of 11-33 tokens,
    2 completions of up to 12 tokens each), and the engine's model (the sampler's weights)."""
    from upslope.data.types import Example
    from upslope.engine import SamplingParams
    from upslope.rollout.hf import HFEngine
    from upslope.rollout.plugin import groups_to_batch

    cache: dict[str, tuple[Batch, Any]] = {}

    def get(name: str) -> tuple[Batch, Any]:
        if name not in cache:
            path = moe_path(name)
            tokenizer = load_tokenizer(path)
            engine = HFEngine(path, tokenizer, dtype="float32")
            prompts = [tokenizer.encode(f"Question {i}: how many legs do {i} spiders have? " * (i + 1)) for i in range(3)]
            params = SamplingParams(n=2, max_new_tokens=12, seed=0, routed_experts=True)
            groups = engine.generate(prompts, params)
            examples = [Example(id=str(i), prompt="", answer="") for i in range(3)]
            cache[name] = groups_to_batch(prompts, examples, groups, params, tokenizer.pad_token_id, 0), engine.model
        return cache[name]
    return get


def scores(model: Any, b: Batch, mode: str, **kw: Any) -> Any:
    opts = dict(MODES[mode])
    shared = (b.prompt_lens, b.seq_lens, b.group_ids) if opts.pop("shared", False) else None
    return token_scores(model, b.input_ids, b.attention_mask, b.loss_mask, shared=shared, chunk_rows=7, **opts, **kw)


class ExpertsSeen:
    """The experts each MoE block's `experts` module is asked to run, read at its input (forward pre-hook),
    per call: [rows, K] index tensors, one list per MoE layer."""

    def __init__(self, model: Any):
        fast_head_matches(model)  # the head's one-time check runs the model: before anything is watched
        self.blocks = [m for m in model.modules() if isinstance(getattr(m, "experts", None), torch.nn.Module)
                       and any(r in routing.routers(model) for r in m.children())]
        self.calls: list[list[torch.Tensor]] = [[] for _ in self.blocks]
        self.shares_prompts = not recurrent_layers(model)  # a hybrid runs each row's prompt (upslope.train.learner.mixers)
        self.top_k = [r.top_k for r in routing.routers(model)]

    def __enter__(self) -> "ExpertsSeen":
        self.handles = [b.experts.register_forward_pre_hook(self._hook(i)) for i, b in enumerate(self.blocks)]
        return self

    def _hook(self, i: int) -> Any:
        k = self.top_k[i]

        def seen(module: Any, args: tuple) -> None:
            if len(args) == 1:  # Llama 4: every expert runs on the router-scaled input, zero where not picked
                picked = (args[0].view(module.num_experts, -1, args[0].shape[-1]) != 0).any(-1).T
                assert bool((picked.sum(-1) <= k).all()), "at most k experts per token get a nonzero input"
                self.calls[i].append(torch.topk(picked.float(), k, -1).indices)  # (a zero state: padding)
            else:
                self.calls[i].append(args[1].detach().clone())
        return seen

    def __exit__(self, *exc: Any) -> None:
        for h in self.handles:
            h.remove()


def routed_as_recorded(b: Batch, seen: ExpertsSeen, mode: str) -> tuple[int, int]:
    """(tokens compared, tokens whose experts differ from the recorded ones) over every recorded real token
    and MoE layer, placing each forward call's rows back at the batch's token positions."""
    rec = b.routed_experts.long()
    compared = differ = 0
    for layer, calls in enumerate(seen.calls):
        if "shared" in mode and seen.shares_prompts:  # the prompts' pass (each group's first sample), then the rest
            assert len(calls) == 2
            groups = [int(torch.nonzero(b.group_ids == g)[0]) for g in b.group_ids.unique()]
            pmax = int(b.prompt_lens[groups].max())
            prompt = calls[0].view(len(groups), pmax, -1)
            comp = calls[1].view(b.size, -1, calls[1].shape[-1])
            pairs = []
            for gi, row in enumerate(groups):
                plen = int(b.prompt_lens[row])
                pairs.append((prompt[gi, pmax - plen:], rec[row, :plen, layer]))
            for row in range(b.size):
                plen, slen = int(b.prompt_lens[row]), int(b.seq_lens[row])
                pairs.append((comp[row, :slen - plen], rec[row, plen:slen, layer]))
        else:
            assert len(calls) == 1
            used = calls[0].view(b.size, b.input_ids.shape[1], -1)
            pairs = [(used[row, :int(b.seq_lens[row])], rec[row, :int(b.seq_lens[row]), layer]) for row in range(b.size)]
        for used, want in pairs:
            recorded = (want >= 0).all(-1)
            same = (used.sort(-1).values == want.sort(-1).values).all(-1)
            compared += int(recorded.sum())
            differ += int((recorded & ~same).sum())
    return compared, differ


@pytest.mark.parametrize("family", by_router_kind(ROUTED))
def test_the_engine_records_every_token_but_the_last(family, sampled):
    b, model = sampled(family)
    layers, k = len(routing.routers(model)), model.config.num_experts_per_tok
    assert b.routed_experts.shape == (*b.input_ids.shape, layers, k) and b.routed_experts.dtype == routing.EXPERT_DTYPE
    recorded = (b.routed_experts >= 0).all(-1).all(-1)
    for row in range(b.size):
        length = int(b.seq_lens[row])
        assert bool(recorded[row, :length - 1].all()), "every token the sampler ran has its experts"
        assert not bool(recorded[row, length - 1:].any()), "the last token (never run) and the padding have none"
    e = b.routed_experts[recorded]
    assert int(e.min()) >= 0 and int(e.max()) < routing.routers(model)[0].num_experts
    assert bool((e.sort(-1).values[..., 1:] != e.sort(-1).values[..., :-1]).all()), "k distinct experts per token"


@pytest.mark.parametrize("family", ROUTED)
def test_replay_runs_the_recorded_experts_with_the_samplers_logprobs(family, sampled):
    b, model = sampled(family)
    mask = b.loss_mask > 0
    for mode in MODES:
        with ExpertsSeen(model) as seen, torch.no_grad():
            out = scores(model, b, mode, routed_experts=b.routed_experts)
        compared, differ = routed_as_recorded(b, seen, mode)
        assert compared > 200 and differ == 0, (mode, compared, differ)
        assert float((out.logprobs - b.sampler_logprobs)[mask].abs().max()) < 5e-5, mode


def softmax_weights(router: Any, hidden: torch.Tensor, picked: torch.Tensor) -> torch.Tensor:
    """Mixtral, Qwen-MoE, OLMoE: the softmax over all experts at the picked ones, renormalised over them
    (Mixtral always; the others with norm_topk_prob)."""
    probs = torch.softmax(torch.nn.functional.linear(hidden, router.weight).float(), -1)
    weights = probs.gather(-1, picked)
    return weights / weights.sum(-1, keepdim=True) if getattr(router, "norm_topk_prob", True) else weights


def sigmoid_weights(router: Any, hidden: torch.Tensor, picked: torch.Tensor) -> torch.Tensor:
    """DeepSeek-V3: each picked expert's sigmoid affinity (the balancing bias only chooses, it does not
    weigh), renormalised over the picked ones with norm_topk_prob, times the routed scaling factor."""
    weights = torch.sigmoid(torch.nn.functional.linear(hidden.float(), router.weight.float())).gather(-1, picked)
    if router.norm_topk_prob:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return weights * router.routed_scaling_factor


def picked_softmax_weights(router: Any, hidden: torch.Tensor, picked: torch.Tensor) -> torch.Tensor:
    """GPT-OSS: the softmax over the picked experts' logits alone (its router has a bias)."""
    logits = torch.nn.functional.linear(hidden, router.weight, router.bias)
    return torch.softmax(logits.gather(-1, picked).float(), -1)


ROUTER_WEIGHTS = {"deepseek_v3": sigmoid_weights, "gpt_oss": picked_softmax_weights}


def forced_router_scores(want: torch.Tensor) -> Any:
    """Llama 4, whose MoE block scales each expert's input by the router's scores (-inf logits but at the top-k,
    then a sigmoid): a router output hook putting the picked experts' logits at `want` [tokens, k] (NOT_ROUTED
    rows: the router's own pick)."""
    def force(router: Any, args: tuple, out: tuple) -> tuple:
        logits = out[1]
        own = torch.topk(logits, router.top_k, dim=1).indices
        picked = torch.where((want >= 0).all(-1, keepdim=True), want, own)
        scores = torch.full_like(logits, float("-inf")).scatter(1, picked, logits.gather(1, picked))
        return torch.sigmoid(scores.float()).to(logits.dtype), logits
    return force


def forced_experts_logprobs(model: Any, b: Batch, family: str) -> torch.Tensor:
    """The reference for replay: the model's own forward, one unpadded row at a time, with each MoE block's
    experts forced at the experts' input to the recorded ones and weighted by the current router as the
    family's router weighs its experts (ROUTER_WEIGHTS, by default `softmax_weights`)."""
    weigh = ROUTER_WEIGHTS.get(family, softmax_weights)
    routers = routing.routers(model)
    blocks = ExpertsSeen(model).blocks
    lp = torch.zeros(b.input_ids.shape)
    for row in range(b.size):
        length = int(b.seq_lens[row])
        rec = b.routed_experts[row, :length].long()
        handles = []
        for layer, (block, router) in enumerate(zip(blocks, routers)):
            if family == "llama4":
                handles.append(router.register_forward_hook(forced_router_scores(rec[:, layer])))
                continue

            def force(module: Any, args: tuple, _router: Any = router, _layer: int = layer) -> tuple:
                hidden, own, _ = args
                want = rec[:, _layer]
                picked = torch.where((want >= 0).all(-1, keepdim=True), want, own)
                return hidden, picked, weigh(_router, hidden, picked).to(hidden.dtype)
            handles.append(block.experts.register_forward_pre_hook(force))
        try:
            logits = model(input_ids=b.input_ids[row:row + 1, :length]).logits[0, :-1].float()
        finally:
            for h in handles:
                h.remove()
        lp[row, 1:length] = torch.log_softmax(logits, -1).gather(-1, b.input_ids[row, 1:length, None])[:, 0]
    return lp * (b.loss_mask > 0)


def moved_routers(model: Any, scale: float = 3.0, seed: int = 5) -> Any:
    """A copy of `model` whose routers moved by `scale` x their RMS in a random direction (the rest unchanged)."""
    import copy

    moved = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for r in routing.routers(moved):
            r.weight.add_(torch.randn(r.weight.shape, generator=gen) * scale * r.weight.pow(2).mean().sqrt())
    return moved


@pytest.mark.parametrize("family", families(ROUTED))
def test_after_the_routers_move_replay_keeps_the_samplers_experts(family, sampled):
    b, sampler_model = sampled(family)
    model = moved_routers(sampler_model)
    mask = b.loss_mask > 0
    with ExpertsSeen(model) as own_seen, torch.no_grad():
        own = scores(model, b, "rows")
    compared, differ = routed_as_recorded(b, own_seen, "rows")
    assert differ > 0.2 * compared, "the update changes the learner's own routing"
    with torch.no_grad():
        reference = forced_experts_logprobs(model, b, family)
    for mode in MODES:
        with ExpertsSeen(model) as seen, torch.no_grad():
            replayed = scores(model, b, mode, routed_experts=b.routed_experts)
        assert routed_as_recorded(b, seen, mode)[1] == 0, mode
        assert float((replayed.logprobs - reference).abs().max()) < 5e-5, mode
    gap = lambda lp: float((lp - b.sampler_logprobs)[mask].abs().mean())  # noqa: E731
    # (the rest of the gap: the moved routers weigh the recorded experts differently; Qwen3-Next's ratio is 0.50)
    assert gap(replayed.logprobs) < 0.6 * gap(own.logprobs), (gap(replayed.logprobs), gap(own.logprobs))


@pytest.mark.parametrize("family", by_router_kind(ROUTED))
def test_the_routers_gradient_under_replay_is_that_of_the_forced_experts(family, sampled):
    b, sampler_model = sampled(family)
    model = moved_routers(sampler_model)
    weights = torch.randn(b.input_ids.shape, generator=torch.Generator().manual_seed(2)) * (b.loss_mask > 0)
    routers = routing.routers(model)
    (forced_experts_logprobs(model, b, family) * weights).sum().backward()
    want = [r.weight.grad.clone() for r in routers]
    for mode in MODES:
        model.zero_grad()
        (scores(model, b, mode, routed_experts=b.routed_experts).logprobs * weights).sum().backward()
        for r, w in zip(routers, want):
            assert float(w.abs().max()) > 0
            assert float((r.weight.grad - w).abs().max()) < 1e-4 * float(w.abs().max()), mode


@pytest.mark.parametrize("family", families(ROUTED, {"qwen3_next"}))
def test_the_load_balancing_loss_is_transformers_own(family, sampled):
    import importlib

    b, model = sampled(family)
    own = model(input_ids=b.input_ids, attention_mask=b.attention_mask.long(), output_router_logits=True)
    # transformers' own, or (DeepSeek-V3 balances by a bias and has none) the same Switch loss as Mixtral's
    balance = getattr(importlib.import_module(type(model).__module__), "load_balancing_loss_func",
                      importlib.import_module("transformers.models.mixtral.modeling_mixtral").load_balancing_loss_func)
    k, experts = model.config.num_experts_per_tok, routing.routers(model)[0].num_experts
    fast_head_matches(model)  # its one-time check runs the model: before this test watches the routers
    for mode in MODES:
        with routing.router_logits(model) as kept:  # the same forward's router logits, for transformers' function
            out = scores(model, b, mode, router_aux=True)
        if "shared" in mode and not recurrent_layers(model):  # two calls (prompts, completions): transformers'
            # function over both, concatenated
            layers = tuple(torch.cat(calls) for calls in kept.calls)
            p_rows = kept.calls[0][0].shape[0]
            groups = b.group_ids.unique()
            first = torch.stack([torch.nonzero(b.group_ids == g)[0, 0] for g in groups])
            pmax = p_rows // len(groups)
            p_mask = torch.arange(pmax)[None] >= (pmax - b.prompt_lens[first])[:, None]
            c_len = b.seq_lens - b.prompt_lens
            c_mask = torch.arange(int(c_len.max()))[None] < c_len[:, None]
            expected = balance(layers, experts, k, torch.cat([p_mask.reshape(-1), c_mask.reshape(-1)])[None])
        else:
            if getattr(own, "aux_loss", None) is not None:
                assert float((out.router_aux_loss - own.aux_loss).detach().abs()) < 1e-5, mode
            # over transformers' own router logits of the same padded batch where its forward returns them
            layers = getattr(own, "router_logits", None) or tuple(c[0] for c in kept.calls)
            expected = balance(layers, experts, k, b.attention_mask.long())
        gap = float((out.router_aux_loss - expected).detach().abs())
        assert gap < 1e-5, (mode, gap)
        model.zero_grad()
        out.router_aux_loss.backward()
        for r in routing.routers(model):
            assert r.weight.grad is not None and float(r.weight.grad.abs().max()) > 0, mode
    model.zero_grad()


@pytest.mark.parametrize("family", ROUTED[:1])
def test_the_load_balancing_gradient_is_the_same_with_checkpointed_layers(family, sampled):
    b, model = sampled(family)
    grads = []
    for mode in ("rows", "checkpointed layers", "shared prompt", "shared + checkpointed"):
        model.zero_grad()
        scores(model, b, mode, router_aux=True).router_aux_loss.backward()
        grads.append([r.weight.grad.clone() for r in routing.routers(model)])
    model.zero_grad()
    for a, c in zip(grads[0], grads[1]):
        assert float((a - c).abs().max()) < 1e-6
    for a, c in zip(grads[2], grads[3]):
        assert float((a - c).abs().max()) < 1e-6


def test_routers_are_found_on_an_empty_model_and_a_dense_model_has_none(moe_path, tiny_model_path):
    for family in ROUTED:
        empty = load_model(moe_path(family), empty=True)
        assert routing.why_not_routed(empty) is None and len(routing.routers(empty)) == 2
    for family in NOT_ROUTED:
        reason = routing.why_not_routed(load_model(moe_path(family), empty=True))
        assert reason is not None and "one top-2 over 4 expert scores" in reason and "\n" not in reason, reason
    reason = routing.why_not_routed(load_model(tiny_model_path, empty=True))
    assert reason is not None and "no MoE routers" in reason and "\n" not in reason


@pytest.mark.parametrize("family", by_router_kind(PAGED))
def test_continuous_batching_records_the_experts_of_every_request(family, moe_path, monkeypatch):
    """The hf_paged engine packs several requests in a forward and shares a prompt's full pages between its
    requests: a 540-token prompt sampled 3 times runs its first 512 tokens for two requests only (the third
    takes their pages); every sample still gets the experts of each of its tokens but the last, and replay
    runs exactly those with the sampler's log-probs."""
    from upslope.data.types import Example
    from upslope.engine import SamplingParams
    from upslope.rollout import paged
    from upslope.rollout.plugin import groups_to_batch

    path = moe_path(family)
    tokenizer = load_tokenizer(path)
    engine = paged.PagedEngine(path, tokenizer, dtype="float32")
    prompts = [tokenizer.encode("Question: how many legs do spiders have?" * 60),
               tokenizer.encode("How many legs do 3 spiders have?")]
    first_positions: list[int] = []
    real_of = paged.RequestRouting.of
    monkeypatch.setattr(paged.RequestRouting, "of", lambda self, request, prompt, n: (
        first_positions.append(min(self.by_request[request])), real_of(self, request, prompt, n))[1])
    params = SamplingParams(n=3, max_new_tokens=8, seed=0, routed_experts=True)
    groups = engine.generate(prompts, params)
    # a shared prompt page; with sliding-window layers beside full ones (GPT-OSS) transformers' scheduler
    # shares one or none, by the order it admits the requests in
    shared = {512} if getattr(engine.model.config, "sliding_window", None) is None else {0, 512}
    assert len(prompts[0]) == 540 and sorted(first_positions)[-1] in shared, first_positions
    b = groups_to_batch(prompts, [Example(id=str(i), prompt="", answer="") for i in range(2)], groups, params,
                        tokenizer.pad_token_id, 0)
    recorded = (b.routed_experts >= 0).all(-1).all(-1)
    assert recorded.sum(1).tolist() == (b.seq_lens - 1).tolist()
    model = engine.model
    with ExpertsSeen(model) as seen, torch.no_grad():  # the learner's own routing: what was recorded, placed right
        scores(model, b, "rows")
    compared, differ = routed_as_recorded(b, seen, "rows")
    assert compared > 3000 and differ == 0
    with ExpertsSeen(model) as seen, torch.no_grad():
        out = scores(model, b, "rows", routed_experts=b.routed_experts)
    assert routed_as_recorded(b, seen, "rows")[1] == 0
    assert float((out.logprobs - b.sampler_logprobs)[b.loss_mask > 0].abs().max()) < 5e-5
