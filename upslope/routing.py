"""MoE routing: a model's routers, the experts each token is routed to (recorded while the model
runs, or replayed into it), and the routers' load-balancing loss.

A router is transformers' top-k router module (Qwen-MoE's, Mixtral's, OLMoE's, DeepSeek-V3's, GPT-OSS's,
...): from a token's hidden state it computes router logits and scores over the experts, then picks the
top-k experts with one `torch.topk` call over the experts' scores (DeepSeek-V3's group pre-selection is
a top-k over groups, which is left alone); the MoE block runs those experts weighted as the router weighs
them. Recording and replaying both act on that one call (a torch function mode active only while a
router runs), so the rest is the router's own code: under replay it weighs the replayed experts from its
current scores (a softmax renormalised over them, sigmoid affinities, a softmax over their logits: as
the family does), and the router's weights get their gradient through them.

Routed experts are kept per token as `[..., routers, top_k]` integers (`EXPERT_DTYPE`), one entry per MoE
layer in module order; `NOT_ROUTED` (-1) marks a token with nothing recorded (padding; a completion's last
token, which the sampler never runs through the model): replay leaves such a token to the router.
"""
from __future__ import annotations

import contextlib
import contextvars
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch.overrides import TorchFunctionMode

EXPERT_DTYPE = torch.int16
NOT_ROUTED = -1


def routers(model: Any) -> list[torch.nn.Module]:
    """The model's MoE routers in module order (one per MoE layer): a child module with `top_k`,
    `num_experts` and a weight, beside a sibling `experts` module."""
    found = []
    for module in model.modules():
        experts = getattr(module, "experts", None)
        if not isinstance(experts, torch.nn.Module):
            continue
        found += [m for m in module.children() if m is not experts and isinstance(getattr(m, "top_k", None), int)
                  and isinstance(getattr(m, "num_experts", None), int) and isinstance(getattr(m, "weight", None),
                                                                                      torch.Tensor)]
    return found


class _Selection(TorchFunctionMode):
    """Active while one router runs: its top-k pick over the experts is recorded (`record`), or replaced by
    `replay` ([rows, top_k], NOT_ROUTED rows left to the router) with the router's own probabilities at
    the replayed experts as their values."""

    def __init__(self, router: torch.nn.Module, replay: torch.Tensor | None = None,
                 record: list[torch.Tensor] | None = None):
        super().__init__()
        self.router, self.replay, self.record = router, replay, record
        self.picks = 0

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func not in (torch.topk, torch.Tensor.topk):
            return out
        scores, (values, picked) = args[0], out
        if scores.shape[-1] != self.router.num_experts or picked.shape[-1] != self.router.top_k:
            return out
        self.picks += 1
        if self.replay is not None:
            replay = self.replay.to(picked.device)
            if replay.shape != picked.shape:
                raise ValueError(f"routing replay: {type(self.router).__name__} routes {picked.shape[0]} tokens but "
                                 f"{replay.shape[0]} were recorded")
            recorded = (replay >= 0).all(-1, keepdim=True)
            picked = torch.where(recorded, replay.long(), picked)
            values = scores.gather(-1, picked)
            out = torch.return_types.topk((values, picked))
        if self.record is not None:
            self.record.append(picked.detach())
        return out


@contextlib.contextmanager
def _around_routers(model: Any, selection: Callable[[int, torch.nn.Module], _Selection]) -> Iterator[list[_Selection]]:
    """Within the block, each router `r` (index `i`) runs under `selection(i, r)` (a fresh one per call);
    yields the selections made, in order."""
    made: list[_Selection] = []
    found = routers(model)
    own = [r.__dict__.get("forward") for r in found]
    for i, router in enumerate(found):
        def forward(*args: Any, _forward: Any = router.forward, _i: int = i, _r: Any = router, **kwargs: Any) -> Any:
            mode = selection(_i, _r)
            made.append(mode)
            with mode:
                return _forward(*args, **kwargs)
        router.forward = forward
    try:
        yield made
    finally:
        for router, forward in zip(found, own):
            if forward is None:
                del router.forward
            else:
                router.forward = forward


class Recording:
    """The experts each router picked, call by call (`calls[router]`: one [rows, top_k] tensor per call)."""

    def __init__(self, count: int):
        self.calls: list[list[torch.Tensor]] = [[] for _ in range(count)]

    def stacked(self, call: int) -> torch.Tensor:
        """[rows, routers, top_k]: every router's pick in its `call`-th call."""
        return torch.stack([c[call] for c in self.calls], dim=1)


@contextlib.contextmanager
def recording(model: Any) -> Iterator[Recording]:
    """Within the block, every pick of the model's routers is recorded (see `Recording`)."""
    rec = Recording(len(routers(model)))
    with _around_routers(model, lambda i, r: _Selection(r, record=rec.calls[i])):
        yield rec


@dataclass(frozen=True)
class _Replay:
    model: Any
    experts: torch.Tensor  # [batch, seq, routers, top_k] of the forward running now


_REPLAYING: contextvars.ContextVar[_Replay | None] = contextvars.ContextVar("upslope_routing_replay", default=None)


@contextlib.contextmanager
def replaying(model: Any, experts: torch.Tensor | None) -> Iterator[None]:
    """Within the block, a forward of the model's body over `[batch, seq]` tokens routes token `[b, s]`
    at MoE layer `r` to the experts `experts[b, s, r]` (recorded by the sampler; NOT_ROUTED: the router's
    own choice). None: nothing is replayed."""
    if experts is None:
        yield
        return
    count = len(routers(model))
    if experts.shape[-2] != count:
        raise ValueError(f"routing replay: {experts.shape[-2]} MoE layers recorded, the model has {count}")
    flat = experts.reshape(-1, *experts.shape[-2:])
    token = _REPLAYING.set(_Replay(model, experts))
    try:
        with _around_routers(model, lambda i, r: _Selection(r, replay=flat[:, i])):
            yield
    finally:
        _REPLAYING.reset(token)


def same_routing_when_recomputed() -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
    """A `context_fn` for torch's non-reentrant activation checkpointing: a layer recomputed in backward
    replays the experts its forward replayed (else the recomputation would route by the current router
    and back-propagate through other experts than the forward ran)."""
    now = _REPLAYING.get()
    if now is None:
        return contextlib.nullcontext(), contextlib.nullcontext()
    return contextlib.nullcontext(), replaying(now.model, now.experts)


class RouterLogits:
    """The router logits of the model's routers, call by call (`calls[router]`: [rows, experts] with gradient),
    and the mask of real tokens of each call (`masks`: [rows])."""

    def __init__(self, count: int):
        self.calls: list[list[torch.Tensor]] = [[] for _ in range(count)]
        self.masks: list[torch.Tensor] = []

    def load_balancing_loss(self, num_experts: int, top_k: int) -> torch.Tensor:
        """The Switch Transformer load-balancing loss over every router and every real token of every call,
        as transformers' `load_balancing_loss_func` computes it over one forward: num_experts x sum over
        experts of (share of top-k picks going to the expert) x (mean router probability of the expert),
        both taken over all layers' tokens together."""
        picks = probs = None
        rows = 0.0
        for layer in self.calls:
            for logits, mask in zip(layer, self.masks):
                p = torch.softmax(logits.float(), dim=-1)
                top = torch.topk(p, top_k, dim=-1).indices
                m = mask.to(p.device, torch.float32)
                count = torch.zeros(num_experts, device=p.device).scatter_add_(0, top.reshape(-1),
                                                                               m.repeat_interleave(top_k))
                mass = (p * m.unsqueeze(-1)).sum(0)
                picks = count if picks is None else picks + count
                probs = mass if probs is None else probs + mass
                rows += float(m.sum())
        if picks is None or probs is None or rows == 0:
            raise ValueError("load-balancing loss: no router ran")
        return (picks / rows * probs / rows).sum() * num_experts


@contextlib.contextmanager
def router_logits(model: Any) -> Iterator[RouterLogits]:
    """Within the block, the router logits of every router call are kept (with gradient); the caller adds
    each call's token mask to `masks` (the same for every router of that call)."""
    found = routers(model)
    kept = RouterLogits(len(found))
    at = _logits_index(model)

    def hook(i: int) -> Callable[..., None]:
        def keep(module: Any, args: Any, out: Any) -> None:
            kept.calls[i].append(out[at.get(type(module), 0)] if isinstance(out, tuple) else out)
        return keep

    handles = [r.register_forward_hook(hook(i)) for i, r in enumerate(found)]
    try:
        yield kept
    finally:
        for h in handles:
            h.remove()


def _logits_index(model: Any) -> dict[type, int]:
    """Where each kind of router of `model` puts its logits in its output tuple, as transformers itself records
    them (`_can_record_outputs`: Llama 4's router returns its scores first, Granite's its picks); the first
    element for a router it does not name."""
    if model in _LOGITS_AT:
        return _LOGITS_AT[model]
    where: dict[type, int] = {}
    for module in model.modules():
        recorded = getattr(module, "_can_record_outputs", None)
        recorder = recorded.get("router_logits") if isinstance(recorded, dict) else None
        target = getattr(recorder, "target_class", None)
        if isinstance(target, type):
            where[target] = int(getattr(recorder, "index", 0) or 0)
    _LOGITS_AT[model] = where
    return where


_LOGITS_AT: "weakref.WeakKeyDictionary[Any, dict[type, int]]" = weakref.WeakKeyDictionary()  # read once a model


def expert_counts(model: Any) -> tuple[int, int]:
    """(experts per MoE layer, experts picked per token) of the model's routers."""
    found = routers(model)
    return found[0].num_experts, found[0].top_k


def probe_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of `module` on the CPU with every parameter and buffer zero, whatever device (meta included)
    or mix of devices the original's tensors are on: something to run once to see what it does."""
    import copy

    probe = copy.deepcopy(module).to_empty(device="cpu")
    with torch.no_grad():
        for t in (*probe.parameters(), *probe.buffers()):
            t.zero_()
    return probe


def why_not_routed(model: Any) -> str | None:
    """Why routing replay or the load-balancing loss cannot act on `model` (its parameters may be on the
    meta device), or None: it has no MoE routers, or a router does not pick its experts with one top-k
    over its expert scores (a kind these do not know)."""
    found = routers(model)
    if not found:
        return f"{type(model).__name__} has no MoE routers (a dense model); it acts on a MoE model's routers only"
    router = probe_copy(found[0])
    hidden = torch.zeros(3, router.weight.shape[-1], dtype=router.weight.dtype)
    mode = _Selection(router)
    try:
        with torch.no_grad(), mode:
            out = router(hidden)
    except Exception as exc:  # a router of another signature
        return (f"{type(model).__name__}'s router {type(router).__name__} could not be run on its own "
                f"({type(exc).__name__}: {exc}); routers of that kind are not supported")
    logits = out[_logits_index(model).get(type(router), 0)] if isinstance(out, tuple) else None
    if mode.picks != 1 or logits is None or logits.shape[-1] != router.num_experts:
        return (f"{type(model).__name__}'s router {type(router).__name__} does not return its logits and pick its "
                f"experts with one top-{router.top_k} over {router.num_experts} expert scores; routers of that kind "
                f"are not supported")
    return None
