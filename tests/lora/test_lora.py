"""LoRA on the real tiny model: merged weights equal the adapter model and PEFT's own merge,
the reference is the base model without a second copy, the learner trains only the adapter
through every forward path, and bad target modules are one clear line."""
from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings, strategies as st

from upslope import lora
from upslope.batch import build_batch
from upslope.config import LoraConfig, load_config
from upslope.errors import ConfigError
from upslope.models import load_model
from upslope.train.learner.objectives import RLObjective
from upslope.train.learner.updater import Updater
from upslope.train.learner.logprobs import token_logprobs, token_logprobs_shared_prompt

LLAMA_PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def base(tiny_model_path):
    return load_model(tiny_model_path, "float32").eval()


def adapted(base_model, seed: int = 0, **options) -> torch.nn.Module:
    """A copy of the base wrapped in LoRA, with a random (non-zero) B so the adapter matters."""
    model = lora.wrap(copy.deepcopy(base_model), LoraConfig(enabled=True, **options))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return model.eval()


def make_batch(seed: int = 0, groups: int = 2, n: int = 3):
    g = torch.Generator().manual_seed(seed)
    prompts, comps, gids = [], [], []
    for gi in range(groups):
        p = torch.randint(5, 2000, (int(torch.randint(3, 8, (1,), generator=g)),), generator=g).tolist()
        for _ in range(n):
            prompts.append(p)
            comps.append(torch.randint(5, 2000, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g).tolist())
            gids.append(gi)
    return build_batch(prompts, comps, [[0.0] * len(c) for c in comps], gids, [False] * len(comps), pad_id=2)


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_merge_by_hand_on_a_one_layer_model():
    """W + (alpha / r) * B @ A, with numbers small enough to check by hand."""
    import peft

    class One(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = torch.nn.Linear(2, 2, bias=False)

        def forward(self, x):
            return self.q_proj(x)

    m = One()
    with torch.no_grad():
        m.q_proj.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    pm = peft.get_peft_model(m, peft.LoraConfig(r=1, lora_alpha=2.0, target_modules=["q_proj"]))
    with torch.no_grad():
        pm.base_model.model.q_proj.lora_A["default"].weight.copy_(torch.tensor([[1.0, 2.0]]))
        pm.base_model.model.q_proj.lora_B["default"].weight.copy_(torch.tensor([[1.0], [-0.5]]))
    merged = dict(lora.merged_weights(pm))
    # scale 2/1 = 2; B @ A = [[1, 2], [-0.5, -1]]
    assert torch.equal(merged["q_proj.weight"], torch.tensor([[3.0, 4.0], [-1.0, -1.0]]))
    x = torch.tensor([[0.5, -1.0]])
    assert torch.allclose(pm(x), x @ merged["q_proj.weight"].T)


def test_merged_model_outputs_equal_the_adapter_model(base):
    """Loading the merged weights into a plain copy of the base reproduces the adapter model's logits."""
    model = adapted(base)
    plain = copy.deepcopy(base)
    pushed = dict(lora.merged_weights(model))
    missing, unexpected = plain.load_state_dict(pushed, strict=False)
    assert not unexpected
    ids = torch.randint(5, 2000, (3, 12), generator=torch.Generator().manual_seed(1))
    want = logits(model, ids)
    assert torch.allclose(logits(plain, ids), want, atol=1e-4)
    assert (logits(base, ids) - want).abs().max() > 1e-2  # the adapter changes the outputs


@settings(max_examples=6, deadline=None)
@given(rank=st.integers(1, 8), alpha=st.sampled_from([1.0, 8.0, 32.0]),
       targets=st.sets(st.sampled_from(LLAMA_PROJECTIONS), min_size=1).map(sorted) | st.just("all-linear"))
def test_named_weights_merge_equals_peft_merge_and_unload(base, rank, alpha, targets):
    """The pushed tensors are PEFT's merge_and_unload weights, under the base model's HF names;
    every weight not pushed is unchanged by the merge (the engine keeps it from its start)."""
    model = adapted(base, rank=rank, alpha=alpha, target_modules=targets)
    pushed = dict(lora.merged_weights(model))
    reference = copy.deepcopy(model).merge_and_unload().state_dict()
    base_state = base.state_dict()
    assert pushed and set(pushed) <= set(base_state)
    for name, tensor in reference.items():
        if name in pushed:
            assert torch.allclose(pushed[name], tensor, atol=1e-6), name
        else:
            assert torch.equal(tensor, base_state[name]), name
    # whole blocks only: the parents of the adapted layers, nothing else (no embeddings, norms)
    short = LLAMA_PROJECTIONS if targets == "all-linear" else targets
    blocks = {layer.rpartition(".")[0] for layer in lora.linear_layers(base) if layer.rpartition(".")[2] in short}
    assert {name.rsplit(".", 2)[0] for name in pushed} == blocks


def test_only_blocks_with_an_adapter_are_pushed(base):
    model = adapted(base, target_modules=["q_proj"])
    names = [n for n, _ in lora.merged_weights(model)]
    assert names == [f"model.layers.{i}.self_attn.{p}_proj.weight" for i in range(2) for p in "qkvo"]


def test_saved_adapter_reads_back_under_the_live_parameter_names(base, tmp_path):
    """A saved adapter's tensors by the adapted model's own names (what a sharded learner loads
    a one-process LoRA checkpoint by): exactly the trainable parameters, with their values."""
    model = adapted(base, rank=4)
    model.save_pretrained(tmp_path, safe_serialization=True)
    live = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    read = lora.adapter_weights(tmp_path)
    assert read.keys() == live.keys() and len(read) == 2 * 7 * 2  # A and B, 7 projections, 2 layers
    assert all(torch.equal(read[k], live[k]) for k in live)


def test_reference_is_the_base_model_without_a_second_copy(base):
    """AdapterOff gives the base model's log-probs through both forward paths; the policy differs."""
    model = adapted(base, seed=3)
    ref = lora.AdapterOff(model)
    b = make_batch()
    args = (b.input_ids, b.attention_mask, b.loss_mask)
    shared = (b.prompt_lens, b.seq_lens, b.group_ids)
    with torch.no_grad():
        want, _ = token_logprobs(base, *args)
        assert torch.allclose(token_logprobs(ref, *args)[0], want, atol=1e-5)
        assert torch.allclose(token_logprobs_shared_prompt(ref, *args, *shared)[0], want, atol=1e-5)
        policy, _ = token_logprobs(model, *args)
    assert (policy - want).abs().max() > 1e-2
    assert sum(p.numel() for p in model.parameters() if not p.requires_grad) == sum(p.numel() for p in base.parameters())


def learner(tiny_model_path, *extra: str) -> tuple[Updater, RLObjective]:
    cfg = load_config(None, [f"model.name={tiny_model_path}", "lora.enabled=true", "optim.lr=1e-2",
                             "train.precision=float32", "train.micro_batch_tokens=64", *extra])
    torch.manual_seed(0)
    updater = Updater.from_config(cfg, tiny_model_path, "cpu")
    return updater, RLObjective.from_config(cfg)


def adapter_state(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.fixture(scope="module")
def rl_batch():
    b = make_batch(seed=4, groups=3, n=4)
    adv = torch.linspace(-1.0, 1.0, b.size).unsqueeze(1)
    b.advantages = adv * b.loss_mask
    return b


def test_learner_trains_only_the_adapter_through_every_forward_path(tiny_model_path, rl_batch):
    """The optimiser holds exactly the adapter parameters; one update through the shared-prompt
    forward, the per-row forward and gradient checkpointing gives the same adapter."""
    results = {}
    for label, extra in {"shared": [], "rows": ["train.share_prompt=false"],
                         "checkpointed": ["train.grad_checkpointing=true"]}.items():
        ln, objective = learner(tiny_model_path, *extra)
        held = {id(p) for g in ln.optimizer.param_groups for p in g["params"]}
        assert held == {id(p) for n, p in ln.model.named_parameters() if ".lora_" in n}
        frozen = {n: p.detach().clone() for n, p in ln.model.named_parameters() if not p.requires_grad}
        before = adapter_state(ln.model)
        ln.update(copy.deepcopy(rl_batch), 1, objective)
        after = adapter_state(ln.model)
        assert any(not torch.equal(before[k], after[k]) for k in before), label
        assert all(torch.equal(p, frozen[n]) for n, p in ln.model.named_parameters() if not p.requires_grad)
        results[label] = after
    for label in ("rows", "checkpointed"):
        for k, v in results["shared"].items():
            assert torch.allclose(results[label][k], v, atol=1e-5), (label, k)


def test_learner_kl_reference_with_lora_shares_the_policy(tiny_model_path, rl_batch, base):
    ln, objective = learner(tiny_model_path, "algo.kl_coef=0.1")
    assert isinstance(ln.reference(), lora.AdapterOff) and ln.reference().model is ln.model
    batch = copy.deepcopy(rl_batch)
    batch.ref_logprobs = ln.logprobs(batch, temperature=1.0, reference=True)
    assert torch.equal(batch.ref_logprobs, ln.logprobs(batch, temperature=1.0))  # a fresh adapter (B = 0) is the base model
    ln.update(batch, 1, objective)
    ref_lp = ln.logprobs(rl_batch, temperature=1.0, reference=True)
    with torch.no_grad():
        base_lp, _ = token_logprobs(base, rl_batch.input_ids, rl_batch.attention_mask, rl_batch.loss_mask)
    assert torch.allclose(ref_lp, base_lp, atol=1e-5)
    assert (ln.logprobs(rl_batch, temperature=1.0) - base_lp).abs().max() > 1e-3  # the policy has moved; the reference has not


def test_bad_target_module_is_one_line_naming_the_modules(base):
    with pytest.raises(ConfigError) as err:
        lora.wrap(copy.deepcopy(base), LoraConfig(enabled=True, target_modules=["q_proj", "qkv_proj"]))
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("lora.target_modules: 'qkv_proj'")
    assert "down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj" in msg
    with pytest.raises(ConfigError, match="'lm_head' is not a linear layer"):  # the LM head is not adaptable
        lora.wrap(copy.deepcopy(base), LoraConfig(enabled=True, target_modules=["lm_head"]))
    assert lora.resolve_targets(base, ["self_attn.q_proj"]) == ["self_attn.q_proj"]  # PEFT's suffix names work


@pytest.mark.parametrize("override, expected", [
    ("lora.target_modules=[]", "lora.target_modules: expected a non-empty list"),
    ("lora.target_modules=q_proj", "'auto' or 'all-linear' (got 'q_proj')"),
    ("lora.target_modules=[q_proj,q_proj]", "distinct module names"),
    ("lora.rank=0", "lora.rank: Input should be greater than or equal to 1"),
    ("lora.dropout=1.0", "lora.dropout: Input should be less than 1"),
    ("lora.rnak=8", "did you mean 'lora.rank'"),
])
def test_bad_lora_config_is_one_line(override, expected):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert "\n" not in str(err.value) and expected in str(err.value), str(err.value)
