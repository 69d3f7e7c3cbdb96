"""INFUSER: drafts parsed from replies, the two-role round on the tiny model (rows, roles, groups, masks), DuGRPO
and the solver's GRPO by hand, and the optimizer-aware influence against a finite difference of the target loss
along the preconditioned step."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from upslope.algos.infuser import dual_normalize, infuser, infuser_difficulty
from upslope.batch import build_batch
from upslope.data.types import Example
from upslope.engine import SamplingParams
from upslope.errors import ConfigError
from upslope.registry import ADVANTAGES, ROLLOUTS
from upslope.rollout.infuser import build_infuser, parse_draft
from upslope.train.learner.influence import adam_preconditioner, completion_mask, influence


@pytest.mark.parametrize("reply, expected", [
    ("Question: How many clips did she sell?\nAnswer: 72", ("How many clips did she sell?", "72")),
    ("Question: What is 1,200 + 3?  If the answer is $1,203.", ("What is 1,200 + 3?", "1203")),
    ("Question: How much more?\nAnswer: 13.50 please", ("How much more?", "13.50")),
    ("Question: How many?", None),  # no answer
    ("Question: ?\nAnswer: 3", None),  # no question
    ("Question: a statement\nAnswer: 3", None),  # not a question on its line
    ("How many? Answer: 3", None),  # no 'Question:'
])
def test_parse_draft(reply, expected):
    assert parse_draft(reply) == expected


class Run:
    """The slice of a run's config the infuser rollout reads."""

    def __init__(self, **options):
        self.rollout = type("R", (), {"options": options})()
        self.data = type("D", (), {"system_prompt": None})()
        self.model = type("M", (), {"use_chat_template": True})()


def test_a_round_has_drafts_answers_and_targets_per_document(hf_engine, tokenizer, encode_chat):
    """Two documents, 2 drafts each (a prefill writing the draft, so the tiny random model always drafts one),
    3 answers per draft: each document's rows share its group id: 2 drafts, 6 answers, 1 target whose completion
    is its reference answer and is not trained on; the answers were asked the drafted question with the passage."""
    rollout = build_infuser(Run(prefill="Question: What is 2 + 3?\nAnswer: 5\n", solver_n=3), tokenizer)
    docs = [Example("Tom has 3 apples.", answer="3"), Example("Ann has 12 pens.", answer="12")]
    batch = rollout(hf_engine, encode_chat([d.prompt for d in docs]), docs,
                    SamplingParams(n=2, max_new_tokens=6, temperature=1.0, seed=0), tokenizer.pad_token_id,
                    group_offset=10)
    roles = [m["infuser_role"] for m in batch.meta]
    assert roles == (["generator"] * 2 + ["solver"] * 6 + ["target"]) * 2
    assert batch.group_ids.tolist() == [10] * 9 + [11] * 9
    for i, m in enumerate(batch.meta):
        text = tokenizer.decode(batch.input_ids[i, :int(batch.prompt_lens[i])])
        if m["infuser_role"] == "solver":
            assert m["answer"] == "5" and "What is 2 + 3?" in text and docs[i // 9].prompt in text
            assert m["infuser_question"] == f"{10 + i // 9}.{(i % 9 - 2) // 3}"  # the group offset: unique per step
        trained = batch.loss_mask[i].sum()
        if m["infuser_role"] == "target":
            answer = batch.input_ids[i, int(batch.prompt_lens[i]):int(batch.seq_lens[i])]
            assert trained == 0 and tokenizer.decode(answer, skip_special_tokens=True) == docs[i // 9].answer
        else:
            assert trained == batch.seq_lens[i] - batch.prompt_lens[i] > 0
    assert batch.meta[0]["metrics"]["infuser/well_formed"] == 1.0
    with pytest.raises(Exception, match="tokenizer"):  # the plain entry point needs the run's set-up
        ROLLOUTS.get("infuser").fn(hf_engine, [], [], SamplingParams(), 0)


def test_dual_normalisation_by_hand():
    """Influences [1, 3, NaN | 5, 7] over two documents: batch z-scores of the valid four (mean 4, std 2.582)
    are [-1.162, -0.387, 0.387, 1.162], the malformed draft -1; then within each document (unbiased std):
    [-1.162, -0.387, -1] -> centred on -0.850, std 0.4077; [0.387, 1.162] -> -0.7071, 0.7071."""
    out = dual_normalize(torch.tensor([1.0, 3.0, float("nan"), 5.0, 7.0]), torch.tensor([0, 0, 0, 1, 1]),
                         invalid_penalty=1.0, eps=0.0)
    z = torch.tensor([-3, -1, 1, 3], dtype=torch.float64) / torch.tensor([1.0, 3, 5, 7]).std().double()
    first = torch.stack([z[0], z[1], torch.tensor(-1.0, dtype=torch.float64)])
    expected = torch.cat([(first - first.mean()) / first.std(), torch.tensor([-1, 1]) / 2 ** 0.5])
    assert torch.allclose(out, expected, atol=1e-9)
    assert torch.equal(dual_normalize(torch.tensor([float("nan")] * 2), torch.tensor([0, 0]), invalid_penalty=1.0, eps=0.0),
                       torch.zeros(2, dtype=torch.float64))  # one document, all malformed: no signal


def hand_batch(tokenizer, rewards, roles, questions):
    ids = [tokenizer.encode(f"prompt {i}") for i in range(len(roles))]
    comps = [tokenizer.encode(f" reply {i}") for i in range(len(roles))]
    meta = [{"infuser_role": r, "infuser_question": q} for r, q in zip(roles, questions)]
    b = build_batch(ids, comps, [[0.0] * len(c) for c in comps], [0] * len(roles), [False] * len(roles),
                    tokenizer.pad_token_id, meta=meta,
                    completion_loss_masks=[[0 if r == "target" else 1] * len(c) for r, c in zip(roles, comps)])
    return replace(b, rewards=torch.tensor(rewards))


def test_the_advantage_by_role(tokenizer):
    """Drafts get DuGRPO of their influence, answers GRPO within their own question, the target 0."""
    roles = ["generator", "generator", "solver", "solver", "solver", "solver", "target"]
    questions = ["0.0", "0.1", "0.0", "0.0", "0.1", "0.1", None]
    batch = hand_batch(tokenizer, [0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0], roles, questions)
    features = torch.tensor([[2.0], [-1.0], [0.0], [0.0], [0.0], [0.0], [0.0]])
    adv = infuser(batch, features, eps=0.0)[:, -1]
    assert torch.allclose(adv, torch.tensor([0.7071, -0.7071, 0.7071, -0.7071, 0.0, 0.0, 0.0]), atol=1e-4)
    assert ADVANTAGES.get("infuser").traits.features == "influence"
    # the baseline: question 0.0 solved 1 of 2 (difficulty 1), 0.1 solved 2 of 2 (0): the same ranking here
    assert torch.allclose(infuser_difficulty(batch, eps=0.0)[:, -1], adv, atol=1e-6)
    assert ADVANTAGES.get("infuser_difficulty").traits.features is None
    with pytest.raises(ConfigError, match="influence"):
        infuser(batch, None)


@pytest.fixture
def updater(tiny_model_path, tmp_path):
    from upslope.config import load_config
    from upslope.train.learner.updater import Updater

    cfg = load_config(None, [f"model.name={tiny_model_path}", f"run_dir={tmp_path}", "train.precision=float32",
                             "model.dtype=float32", "optim.lr=1e-3"])
    return Updater.from_config(cfg, tiny_model_path, "cpu")


def plain_logprobs(model, mb):
    """[n, L]: log p(token t | < t) from the model's full logits (0 at position 0): the reference the pass is held to."""
    logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask.long(), use_cache=False).logits
    lp = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, mb.input_ids[:, 1:, None])[..., 0]
    return torch.cat([torch.zeros_like(lp[:, :1]), lp], dim=1)


def target_loss(updater, batch, rows):
    tb = batch.select(rows)
    mask = completion_mask(tb)
    with torch.no_grad():
        return float(-(plain_logprobs(updater.model, tb) * mask).sum() / mask.sum())


def test_influence_is_the_target_loss_change_along_the_preconditioned_step(updater, tokenizer):
    """After one optimiser step (so P comes from real second moments), a question's influence <g_T, P g_q> equals
    the central finite difference of the target loss along -P g_q; a question whose answers tie scores 0, a
    malformed draft NaN, and answers and targets 0."""
    roles = ["generator", "generator", "generator", "solver", "solver", "solver", "solver", "target", "target"]
    questions = ["0.0", "0.1", None, "0.0", "0.0", "0.1", "0.1", None, None]
    batch = hand_batch(tokenizer, [0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0], roles, questions)
    params = [p for p in updater.model.parameters() if p.requires_grad]
    noise = torch.Generator().manual_seed(0)
    for p in params:  # one AdamW step on unit-scale gradients: second moments near 1, P near 1 / (1 + eps)
        p.grad = torch.randn(p.shape, generator=noise)
    updater.optimizer.step()
    updater.optimizer.zero_grad(set_to_none=True)
    pre = [adam_preconditioner(updater.optimizer, p) for p in params]
    assert all(x is not None for x in pre)
    got = influence(updater, batch)[:, 0]
    assert torch.isnan(got[2]) and got[1] == 0 and torch.all(got[3:] == 0)
    # the question's surrogate gradient (GRPO advantages of rewards [1, 0]: +-1/sqrt 2), preconditioned: the step's
    # direction; then the target loss on either side of it
    rows, adv = [3, 4], torch.tensor([0.5 ** 0.5, -(0.5 ** 0.5)])
    mb = batch.select(rows)
    surrogate = -((plain_logprobs(updater.model, mb) * mb.loss_mask).sum(1) * adv).sum() / mb.loss_mask.sum()
    direction = [pr * g for pr, g in zip(pre, torch.autograd.grad(surrogate, params))]
    h = 1e-4  # central difference: 0.3% from the derivative here (1e-3: 23% off, curvature)
    with torch.no_grad():
        for p, d in zip(params, direction):
            p.add_(h * d)
        ahead = target_loss(updater, batch, [7, 8])
        for p, d in zip(params, direction):
            p.sub_(2 * h * d)
        behind = target_loss(updater, batch, [7, 8])
        for p, d in zip(params, direction):
            p.add_(h * d)
    assert abs(float(got[0])) > 1.0
    assert float(got[0]) == pytest.approx((ahead - behind) / (2 * h), rel=2e-2)


def test_the_influence_pass_refuses_a_sharded_learner_before_any_work(tmp_path):
    from upslope.config import load_config
    from upslope.train.trainers.rl import check_config

    recipe = Path(__file__).resolve().parents[2] / "recipes" / "infuser.yaml"
    cfg = load_config(recipe, [f"run_dir={tmp_path}", "dist.learner_procs=2"])
    with pytest.raises(ConfigError, match="dist.learner_procs=2: advantage 'infuser' reads 'influence'"):
        check_config(cfg)
