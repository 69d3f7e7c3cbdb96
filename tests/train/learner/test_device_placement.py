"""Device placement caught on the CPU: the learner's optimiser, LM head and lean activations
run with every tensor on the `meta` device, where torch refuses to mix in a CPU tensor (the
same class of bug as a CPU tensor meeting CUDA parameters, which crashed the first GPU run);
and no device-less tensor constructor creeps into learner code."""
from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

from upslope.train.learner.adamw import QBLOCK, AdamW, RoundingNoise
from upslope.train.learner.logprobs import _chunked_head
from upslope.train.learner.memory import use_lean_activations

META = torch.device("meta")
LEARNER = Path(__file__).resolve().parents[3] / "upslope" / "train" / "learner"


def test_meta_tensors_refuse_to_mix_with_cpu_tensors():
    """The premise of this file: ops mixing meta and CPU tensors raise, as they do between CUDA
    and CPU (among them `lerp_`, the op of the first GPU crash; not every op checks on meta,
    e.g. in-place `add_` and `linear` do not, so the grep test below backs this up)."""
    for op in (lambda m: m.lerp_(torch.ones(4), 0.1), lambda m: m + torch.ones(4),
               lambda m: m.addcmul_(torch.ones(4), torch.ones(4))):
        with pytest.raises(RuntimeError, match="device"):
            op(torch.zeros(4, device=META))


@pytest.mark.parametrize("param_dtype,state_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                                     (torch.bfloat16, torch.int8), (torch.float32, torch.int8)],
                         ids=["fp32", "bf16-sr", "bf16-8bit", "fp32-8bit"])
def test_adamw_keeps_state_and_temporaries_on_the_parameters_device(param_dtype, state_dtype):
    """Every path of the optimiser (chunked, stochastic rounding, 8-bit moments) on meta."""
    p = torch.nn.Parameter(torch.empty(3 * QBLOCK + 5, device=META, dtype=param_dtype))
    p.grad = torch.empty_like(p)
    opt = AdamW([p], lr=1e-3, weight_decay=0.1, state_dtype=state_dtype, chunk=2 * QBLOCK)
    opt.step()
    opt.step()
    moments = {k: v for k, v in opt.state[p].items() if k != "step"}
    assert moments and all(v.device == META for v in moments.values()), moments


def test_rounding_noise_is_the_same_draw_on_any_device():
    """The stochastic-rounding noise is drawn on the CPU (a resumed run gets the same noise on
    another device) and handed out on the device asked for (in-place `add_` does not check)."""
    a, b = RoundingNoise(QBLOCK, seed=3, step=2), RoundingNoise(QBLOCK, seed=3, step=2)
    assert a.take(10, META).device == META
    assert torch.equal(a.buf, b.buf)


def test_adamw_state_saved_on_one_device_loads_onto_the_parameters_device():
    """A CPU checkpoint's optimiser state resumes onto parameters elsewhere (here meta)."""
    cpu = torch.nn.Parameter(torch.zeros(QBLOCK, dtype=torch.bfloat16))
    cpu.grad = torch.ones_like(cpu)
    saved = AdamW([cpu], lr=1e-3, state_dtype=torch.int8)
    saved.step()
    p = torch.nn.Parameter(torch.empty(QBLOCK, device=META, dtype=torch.bfloat16))
    p.grad = torch.empty_like(p)
    opt = AdamW([p], lr=1e-3, state_dtype=torch.int8)
    opt.load_state_dict(saved.state_dict())
    assert {v.device for k, v in opt.state[p].items() if k != "step"} == {META}
    opt.step()


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "autocast"])
def test_lm_head_logprobs_forward_and_backward_on_meta(autocast):
    """The chunked log-prob head (the custom autograd path) and its checkpointed path (gathered
    ids, top-k) run forward and backward without creating a tensor off the input's device."""
    h = torch.empty(7, 16, device=META, requires_grad=True)
    head = torch.nn.Linear(16, 50, bias=True, device=META)
    model = type("M", (), {"get_output_embeddings": lambda self: head})()
    targets = torch.zeros(7, dtype=torch.long, device=META)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):  # (meta has no autocast: a no-op there)
        logp, ent, *_ = _chunked_head(model, h, targets, chunk_rows=3, temperature=0.7)
        logp.sum().backward()
        assert logp.device == ent.device == h.grad.device == head.weight.grad.device == head.bias.grad.device == META
        outs = _chunked_head(model, h, targets, chunk_rows=3, temperature=1.0, entropy_grad=True,
                             gather_ids=torch.zeros(7, 2, dtype=torch.long, device=META), top_k=2)
        sum(o.float().sum() for o in outs[:4]).backward()
    assert all(o.device == META for o in outs)


def test_lean_activations_forward_and_backward_on_meta():
    cfg = LlamaConfig(hidden_size=16, intermediate_size=32, num_attention_heads=2, hidden_act="silu")
    block = torch.nn.Sequential(LlamaRMSNorm(16), LlamaMLP(cfg)).to(META)
    assert use_lean_activations(block) == 2
    x = torch.empty(2, 5, 16, device=META, requires_grad=True)
    block(x).sum().backward()
    assert x.grad.device == META and all(p.grad.device == META for p in block.parameters())


# constructors that allocate on the default (CPU) device unless given `device=`
_CONSTRUCTOR = re.compile(r"torch\.(zeros|ones|empty|full|arange|randn|rand|randint|tensor|linspace|eye)\(")
# learner-side constructors that are on the CPU on purpose (the line says why, or it builds CPU-side results)
_CPU_ON_PURPOSE = ("RoundingNoise", "torch.tensor(0.0)", "torch.randint(0, self.chunk + 1", "generator=self.gen",
                   "# cpu:")


def test_no_device_less_tensor_constructors_in_learner_code():
    """Learner code creates tensors on the device of the tensors it works with (`device=`,
    `new_*`, `*_like`); a CPU-side tensor on purpose carries a `# cpu:` note saying why."""
    offenders = []
    for path in sorted(LEARNER.glob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0] if "# cpu:" not in line else line
            for match in _CONSTRUCTOR.finditer(code):
                call = line[match.start():]
                if "device=" not in call and not any(s in line for s in _CPU_ON_PURPOSE):
                    offenders.append(f"{path.name}:{number}: {line.strip()}")
    assert not offenders, "tensor constructors without device= in learner code:\n" + "\n".join(offenders)


# ---------------------------------------------------------------- every learner-side plugin on meta

def _meta(*shape: int) -> torch.Tensor:
    return torch.randn(*shape).to(META)


def _learner_plugin_calls() -> list[tuple[str, str, object]]:
    """(kind, name, call) for every registered plugin the learner runs on its own device: policy
    losses, KL estimators, distillation and preference losses, with default options."""
    from upslope.algos.distill import DistillInputs
    from upslope.algos.preference import PairLogps, PairRewards
    from upslope.registry import DISTILL_LOSSES, KL_ESTIMATORS, POLICY_LOSSES, PREFERENCE_LOSSES, load_builtins

    load_builtins()
    n, length, k = 4, 6, 3
    mask = torch.ones(n, length).to(META)
    calls = []
    for name, entry in POLICY_LOSSES._entries.items():
        stats = ({"entropy": _meta(n, length), "topk_logprobs": _meta(n, length, max(1, entry.traits.top_k))}
                 if entry.traits.token_stats else {})
        fn = POLICY_LOSSES.bind(name, {}, where="test")
        calls.append(("policy_loss", name, lambda fn=fn, stats=stats: fn(_meta(n, length).requires_grad_(),
                                                                      _meta(n, length), _meta(n, length), mask, **stats)))
    for name in KL_ESTIMATORS._entries:
        fn = KL_ESTIMATORS.bind(name, {}, where="test")
        calls.append(("kl", name, lambda fn=fn: fn(_meta(n, length), _meta(n, length))))
    for name in DISTILL_LOSSES._entries:
        fn = DISTILL_LOSSES.bind(name, {}, where="test")
        fn = fn() if inspect.isclass(DISTILL_LOSSES.get(name).fn) else fn  # a loss with state: its instance
        inputs = DistillInputs(_meta(n, length), _meta(n, length), mask, _meta(n, length, k), _meta(n, length, k),
                               _meta(n, length))
        calls.append(("distill_loss", name, lambda fn=fn, x=inputs: fn(x)))
    for name, entry in PREFERENCE_LOSSES._entries.items():
        fn = PREFERENCE_LOSSES.bind(name, {}, where="test")
        pairs = PairLogps(_meta(n), _meta(n), torch.ones(n).to(META), torch.ones(n).to(META))
        extra = {"rewards": PairRewards(_meta(n), _meta(n))} if entry.traits.rewards else {}
        calls.append(("preference_loss", name, lambda fn=fn, p=pairs, extra=extra: fn(p, p, **extra)))
    return calls


def test_every_learner_side_plugin_runs_on_the_learners_device():
    """A loss plugin that builds a tensor on the CPU (a constant, a mask, a zero) fails on a GPU
    learner; on `meta` it fails the same way here. Covers plugins added later too."""
    calls = _learner_plugin_calls()
    assert {kind for kind, _, _ in calls} == {"policy_loss", "kl", "distill_loss", "preference_loss"}
    failed = []
    for kind, name, call in calls:
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - every failure is reported with its plugin
            failed.append(f"{kind} {name}: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
    assert failed == [], "\n".join(failed)

