"""The scalar-head model on the Updater: the Bradley-Terry loss against a hand computation and
its gradient's sign, the clipped value loss by hand, an update that moves the scores the way
the loss says, scores equal to HF's sequence-classification class, and the critic's state
round trip (weights, optimiser, schedule)."""
from __future__ import annotations

import copy
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from upslope.batch import build_batch
from upslope.config import load_config
from upslope.algos.preference import bradley_terry_loss
from upslope.train.learner.objectives import BradleyTerryObjective, ValueObjective, pair_metrics
from upslope.scalar_head import load_scalar_model, score_positions, scalar_loader
from upslope.train.learner.updater import Updater
from upslope.train.methods.pair_batch import pair_batch


def test_bradley_terry_loss_by_hand():
    """-log sigmoid(rc - rr - m) = log(1 + exp(-(rc - rr - m))), worked out by hand."""
    chosen, rejected = torch.tensor([1.0, 0.0, 3.0]), torch.tensor([0.0, 2.0, 3.0])
    got = bradley_terry_loss(chosen - rejected)
    want = [math.log(1 + math.exp(-1.0)), math.log(1 + math.exp(2.0)), math.log(2.0)]
    assert got.tolist() == pytest.approx(want, rel=1e-6)
    with_margin = bradley_terry_loss(chosen - rejected - 0.5)  # the chosen must win by 0.5
    assert with_margin.tolist() == pytest.approx([0.474077, 2.578889, 0.974077], rel=1e-5)


@settings(max_examples=50, deadline=None)
@given(st.floats(-20, 20), st.floats(-20, 20), st.floats(0, 5))
def test_bradley_terry_gradient_raises_chosen_and_lowers_rejected(rc, rr, margin):
    """Descending the loss always raises the chosen score and lowers the rejected one, by the same amount."""
    c, r = torch.tensor(rc, requires_grad=True), torch.tensor(rr, requires_grad=True)
    bradley_terry_loss(c - r - margin).backward()
    assert c.grad < 0 < r.grad and float(c.grad) == pytest.approx(-float(r.grad))
    assert float(r.grad) == pytest.approx(1 / (1 + math.exp(rc - rr - margin)), rel=1e-4, abs=1e-7)


def test_pair_metrics_count_ties_as_half():
    m = pair_metrics(torch.tensor([2.0, 1.0, 0.0, 5.0]), torch.tensor([1.0, 1.0, 3.0, 0.0]))
    assert m["rm/accuracy"] == 0.625 and m["rm/margin"] == pytest.approx((1 + 0 - 3 + 5) / 4)


def test_clipped_value_loss_by_hand():
    """0.5 * max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2), mean over the trained tokens."""
    b = build_batch([[1, 2]], [[3, 4, 5]], [[0.0] * 3], [0], [False], 0)
    mask = b.loss_mask  # [[0, 0, 1, 1, 1]]
    v_new = torch.tensor([[0.0, 0.0, 1.0, 0.5, -1.0]])
    b.values = torch.tensor([[0.0, 0.0, 0.0, 0.4, -0.1]])
    b.returns = torch.tensor([[0.0, 0.0, 2.0, 0.0, -1.0]])
    out = ValueObjective(0.2).loss(v_new, b, {"num_tokens": 3.0, "num_seqs": 1.0})
    loss, m = out.loss, out.metrics
    # token 2: (1-2)^2=1 vs clipped 0.2: (0.2-2)^2=3.24 -> 3.24; token 3: 0.25 vs (0.5-0)^2=0.25 -> 0.25;
    # token 4: (-1+1)^2=0 vs clipped -0.3: (-0.3+1)^2=0.49 -> 0.49
    assert float(loss) == pytest.approx(0.5 * (3.24 + 0.25 + 0.49) / 3, rel=1e-6)
    assert m["clip_frac"] == pytest.approx(2 / 3)
    unclipped = ValueObjective(None).loss(v_new, b, {"num_tokens": 3.0, "num_seqs": 1.0}).loss
    assert float(unclipped) == pytest.approx(0.5 * (1 + 0.25 + 0) / 3, rel=1e-6)
    assert mask.sum() == 3


def test_score_positions_skip_right_padding_and_a_trailing_pad_id_token():
    ids = torch.tensor([[5, 6, 7, 2, 2], [5, 6, 2, 9, 2], [5, 2, 2, 2, 2]])
    att = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])
    assert score_positions(ids, att, 2).tolist() == [2, 3, 0]
    assert score_positions(ids, att, None).tolist() == [3, 4, 1]


@pytest.fixture(scope="module")
def rm_updater(tiny_model_path, tokenizer):
    cfg = load_config(None, [f"model.name={tiny_model_path}", "model.dtype=float32", "train.precision=float32",
                             "optim.lr=1e-2", "train.micro_batch_tokens=256", "train.steps=3"])
    return Updater.from_config(cfg, tiny_model_path, "cpu", loader=scalar_loader(pad_id=tokenizer.pad_token_id))


def test_a_bradley_terry_update_widens_the_margin(rm_updater, encode_chat, tokenizer):
    """Scores start at 0 (zero head); one Updater step on the pairs puts every chosen reply above its rejected one."""
    prompts = encode_chat(["Which is better?", "Pick one."])
    chosen = [tokenizer("great answer")["input_ids"] + [2], tokenizer("fine")["input_ids"] + [2]]
    rejected = [tokenizer("bad")["input_ids"] + [2], tokenizer("awful awful")["input_ids"] + [2]]
    batch = pair_batch(prompts, chosen, rejected, [0, 1], tokenizer.pad_token_id)
    model = rm_updater.model
    with torch.no_grad():
        before = model.sequence_scores(batch.input_ids, batch.attention_mask)
    assert before.abs().max() == 0
    objective = BradleyTerryObjective(margin=0.0)
    metrics = rm_updater.update(batch, 1, objective)
    assert metrics["loss"] == pytest.approx(math.log(2), rel=1e-5)  # every pair tied at 0 before the step
    assert metrics["rm/accuracy"] == 0.5
    with torch.no_grad():
        after = model.sequence_scores(batch.input_ids, batch.attention_mask)
    assert bool((after[0::2] > after[1::2]).all()), after


def test_scores_match_hf_sequence_classification(rm_updater, tmp_path, tokenizer, encode_chat):
    """Saved, the model is an HF AutoModelForSequenceClassification giving the same scores, and it reloads
    as a scalar-head model with its trained head."""
    from transformers import AutoModelForSequenceClassification

    model = rm_updater.model
    model.save_pretrained(tmp_path / "rm")
    batch = build_batch(encode_chat(["a", "b b b"]), [[10, 11, 2], [12, 2]], [[0.0] * 3, [0.0] * 2], [0, 1],
                        [False, False], tokenizer.pad_token_id)
    hf = AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm").eval()
    again = load_scalar_model(str(tmp_path / "rm"), pad_id=tokenizer.pad_token_id).eval()
    with torch.no_grad():
        ours = model.eval().sequence_scores(batch.input_ids, batch.attention_mask)
        theirs = hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask.long()).logits.squeeze(-1)
        reloaded = again.sequence_scores(batch.input_ids, batch.attention_mask)
    model.train()
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(ours, reloaded)
    assert ours.abs().min() > 0  # the trained head, not a fresh zero one


def test_critic_state_round_trip(tiny_model_path):
    """The critic's checkpoint state restores its weights, optimiser moments and schedule exactly."""
    from upslope.train.methods.critic import Critic

    cfg = load_config(None, [f"model.name={tiny_model_path}", "algo.advantage.name=gae", "train.precision=float32",
                             "model.dtype=float32", "train.micro_batch_tokens=256", "critic.lr=1e-2"])
    b = build_batch([[1, 2, 3]] * 2, [[5, 6, 7], [8, 9]], [[0.0] * 3, [0.0] * 2], [0, 0], [False, False], 2)
    b.returns = torch.ones_like(b.loss_mask) * b.loss_mask
    a = Critic.from_config(cfg, tiny_model_path, torch.device("cpu"))
    b.values = a.values(b)
    m = a.train_step(b)
    assert m["critic/loss"] == pytest.approx(0.5, rel=1e-6) and m["critic/clip_frac"] == 0.0  # V = 0, R = 1
    c = Critic.from_config(cfg, tiny_model_path, torch.device("cpu"))
    c.load(copy.deepcopy(a.state()))  # as through torch.save / torch.load (state_dicts hold live tensors)
    torch.testing.assert_close(a.values(b), c.values(b), rtol=0, atol=0)
    a.train_step(b)
    c.train_step(b)
    torch.testing.assert_close(a.values(b), c.values(b), rtol=0, atol=0)
    assert a.values(b).abs().max() > 0


def test_a_critic_state_of_another_shape_is_one_error_line(tiny_model_path):
    """An older checkpoint's critic (a `body.*` / `head.*` module) cannot be loaded: one line, no traceback."""
    from upslope.errors import UpslopeError
    from upslope.train.methods.critic import Critic

    cfg = load_config(None, [f"model.name={tiny_model_path}", "algo.advantage.name=gae", "train.precision=float32",
                             "model.dtype=float32"])
    critic = Critic.from_config(cfg, tiny_model_path, torch.device("cpu"))
    old = {"weights": {"head.weight": torch.zeros(1, 128), "head.bias": torch.zeros(1)},
           "optimizer": critic.updater.optimizer.state_dict()}
    with pytest.raises(UpslopeError, match="critic state does not fit this critic") as err:
        critic.load(old)
    assert "\n" not in str(err.value)
