"""TreeRPO / CATPO tree rollouts: branch points and masks by hand, the tree on the real
HF engine (tiny model, SmolLM2 tokenizer) and on vLLM (slow), CATPO's healing, and the policy gradient of a
tree batch against the hand computation over its distinct nodes. The critique: tests/agents/test_socratic.py."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from upslope.agents.socratic import arith_critique
from upslope.algos.aggregate import aggregate, loss_normalizers
from upslope.algos.tree import segments
from upslope.batch import build_batch
from upslope.data.types import Example
from upslope.engine import SamplingParams
from upslope.errors import ConfigError
from upslope.registry import ADVANTAGES, POLICY_LOSSES, ROLLOUTS
from upslope.rollout.tree import Leaf, branch_point, once_masks
from upslope.train.learner.logprobs import token_logprobs

PARAMS = SamplingParams(n=8, temperature=1.0, max_new_tokens=6, seed=4, stop_token_ids=[2])


def test_branch_point_by_hand():
    """Fixed: the depth, kept within [the parent's branch point, the last token]. Entropy: before the most
    surprising token (-log p 3.0 at 1), after the parent's branch point once there is one (then 1.0 at 3)."""
    leaf = Leaf([9, 9, 9, 9], [-0.1, -3.0, -0.2, -1.0], "stop", ["0"], [], 4)
    assert [branch_point(leaf, d, "fixed") for d in (2, 9, 0)] == [2, 3, 0]
    assert branch_point(replace(leaf, ends=[2]), 0, "fixed") == 2
    assert branch_point(leaf, 0, "entropy") == 1
    assert branch_point(replace(leaf, ends=[1]), 0, "entropy") == 3
    assert branch_point(Leaf([2], [-0.5], "stop", ["0"], [], 1), 1, "fixed") == 0  # one token: branch before it


def test_once_masks_by_hand():
    """Leaves 0.0 and 0.1 share node 0 (token 0): only the first trains it; a graft h0 is all its own."""
    trees = [[Leaf([1, 2, 3], [0.0] * 3, "stop", ["0", "0.0"], [1], 3),
              Leaf([1, 4, 5], [0.0] * 3, "stop", ["0", "0.1"], [1], 2),
              Leaf([6, 7], [0.0] * 2, "stop", ["h0"], [], 2, graft=True)]]
    assert once_masks(trees) == [[1, 1, 1], [0, 1, 1], [1, 1]]


def _examples(encode_chat, meta=True):
    qs, answers = ["47 + 35 =", "12 + 30 ="], [82, 42]
    ops = [{"a": 47, "b": 35, "op": "+"}, {"a": 12, "b": 30, "op": "+"}] if meta else [{}, {}]
    return encode_chat(qs), [Example(prompt=q, answer=a, meta=m) for q, a, m in zip(qs, answers, ops)]


def nodes_of(b):
    """(group, node) -> (rows through it, (row, start, end) of its first row), in completion positions."""
    out: dict = {}
    for i, m in enumerate(b.meta):
        spans = segments(m["tree"]["ends"], int(b.completion_lens[i]))
        for name, (s, e) in zip(m["tree"]["nodes"], spans):
            rows, first = out.get((int(b.group_ids[i]), name), ([], (i, s, e)))
            out[(int(b.group_ids[i]), name)] = (rows + [i], first)
    return out


def assert_prefixes_shared(b, nodes):
    """Every row through a node holds the node's tokens and sampler log-probs on its segment."""
    for rows, (first, s, e) in nodes.values():
        p = int(b.prompt_lens[first])
        for i in rows:
            assert torch.equal(b.input_ids[i, p + s:p + e], b.input_ids[first, p + s:p + e])
            assert torch.equal(b.sampler_logprobs[i, p + s:p + e], b.sampler_logprobs[first, p + s:p + e])


def test_tree_rollout_shares_prefixes_on_the_real_engine(hf_engine, encode_chat):
    """n 8, branches 2 at depths 1 and 2: 2 full paths per prompt, each branched twice. Leaves under one node
    hold the same tokens and sampler log-probs on its segment, a path's first children are its own sample
    (the plain rollout with n=2 and the same seed), and every node's tokens were sampled once."""
    prompts, examples = _examples(encode_chat)
    b = ROLLOUTS.bind("tree")(hf_engine, prompts, examples, PARAMS, 2)
    assert b.size == 16 and b.group_ids.tolist() == [0] * 8 + [1] * 8
    assert [m["tree"]["nodes"] for m in b.meta[:2]] == [["0", "0.0", "0.0.0"], ["0", "0.0", "0.0.1"]]
    assert all(m["tree"]["ends"] == [1, 2] for m in b.meta)
    own = hf_engine.generate(prompts, replace(PARAMS, n=2))
    for g in range(2):
        for j in range(2):
            assert b.meta[8 * g + 4 * j]["completion"] == own[g][j].text
    nodes = nodes_of(b)
    assert len(nodes) == 2 * (2 + 4 + 8)
    assert_prefixes_shared(b, nodes)
    sampled = sum(m["metrics"]["tree/sampled_tokens"] for m in b.meta)
    assert sampled == sum(e - s for _, (_, s, e) in nodes.values()) < int(b.completion_lens.sum())
    assert int(b.completion_lens.max()) <= PARAMS.max_new_tokens
    assert b.loss_mask.sum() == b.completion_lens.sum()  # every_leaf: each row trains its whole path
    once = ROLLOUTS.bind("tree", {"shared_prefix": "once"})(hf_engine, prompts, examples, PARAMS, 2)
    assert torch.equal(once.input_ids, b.input_ids) and once.loss_mask.sum() == sampled


@pytest.mark.slow  # the session's vLLM engine takes a minute to start on CPU
def test_entropy_tree_rollout_on_vllm(vllm_engine, encode_chat):
    """The same tree through vLLM's plain generate (its prefix cache serves the shared prefixes), branching
    before the most surprising token: each branch point is the argmax surprisal of the path it splits."""
    prompts, examples = _examples(encode_chat)
    b = ROLLOUTS.bind("tree", {"points": "entropy"})(vllm_engine, prompts, examples, PARAMS, 2)
    assert b.size == 16 and int(b.completion_lens.max()) <= PARAMS.max_new_tokens
    assert_prefixes_shared(b, nodes_of(b))
    for i in range(0, 16, 4):  # the path's own sample: its first branch point is its most surprising token
        p, s = int(b.prompt_lens[i]), int(b.seq_lens[i])
        surprisal = -b.sampler_logprobs[i, p:s]
        assert b.meta[i]["tree"]["ends"][0] == int(torch.argmax(surprisal))


def test_a_tree_that_does_not_fit_rollout_n_is_one_config_error(hf_engine, encode_chat):
    prompts, examples = _examples(encode_chat)
    with pytest.raises(ConfigError, match=r"rollout.n=6 must be a multiple of it"):
        ROLLOUTS.bind("tree")(hf_engine, prompts, examples, replace(PARAMS, n=6), 2)


def test_all_fail_trees_are_healed_from_the_critique(hf_engine, encode_chat, tokenizer):
    """The random tiny model fails every leaf, so each tree gets 2 grafts, regrown from leaves 0 and 4: a
    graft starts with its source leaf's tokens before the failure point and hangs under the deepest node
    that ends by then. Without operands the critique judges nothing, so nothing is healed."""
    prompts, examples = _examples(encode_chat)
    b = ROLLOUTS.bind("tree", {"heal_leaves": 2})(hf_engine, prompts, examples, PARAMS, 2)
    assert b.size == 20 and [m["metrics"]["tree/graft"] for m in b.meta] == ([0.0] * 8 + [1.0] * 2) * 2
    dec = lambda t: tokenizer.decode(t, skip_special_tokens=True)  # noqa: E731
    for g in range(2):
        for h, src in enumerate((10 * g, 10 * g + 4)):
            graft, p = 10 * g + 8 + h, int(b.prompt_lens[src])
            leaf = b.input_ids[src, p:int(b.seq_lens[src])].tolist()
            fp, _ = arith_critique(examples[g], leaf, dec)
            assert b.input_ids[graft, p:p + fp].tolist() == leaf[:fp]
            ends = b.meta[src]["tree"]["ends"]
            keep = sum(e <= fp for e in ends)
            assert b.meta[graft]["tree"]["ends"] == ends[:keep]
            assert b.meta[graft]["tree"]["nodes"][:keep] == b.meta[src]["tree"]["nodes"][:keep]
    plain = ROLLOUTS.bind("tree", {"heal_leaves": 2})(hf_engine, *_examples(encode_chat, meta=False), PARAMS, 2)
    assert plain.size == 16


@pytest.fixture(scope="module")
def tiny_policy(tiny_model_path):
    from upslope.models import load_model

    return load_model(tiny_model_path, "float32")


@pytest.mark.parametrize("shared", ["every_leaf", "once"])
def test_tree_gradient_is_the_hand_computation_over_distinct_nodes(hf_engine, encode_chat, tiny_policy, shared):
    """The policy gradient (ppo_clip at ratio 1, token_mean) of the tree batch equals the hand computation
    -1/T sum_nodes c_N A_N grad log p(segment_N | prompt, prefix), each node's segment scored once in its own
    context: c_N = the leaves under the node (every_leaf: a leaf row is a whole trajectory) or 1 (once), T the
    trained tokens of the batch."""
    prompts, examples = _examples(encode_chat)
    b = ROLLOUTS.bind("tree", {"shared_prefix": shared})(hf_engine, prompts, examples, replace(PARAMS, n=4), 2)
    b.rewards = torch.tensor([1.0, 0, 0, 1, 0, 1, 1, 1])
    adv = ADVANTAGES.bind("tree", {"scale_by_std": False})(b)
    model = tiny_policy
    model.zero_grad()
    mask = b.loss_mask
    lp, _ = token_logprobs(model, b.input_ids, b.attention_mask, mask > 0)
    per_token, _ = POLICY_LOSSES.get("ppo_clip").fn(lp, lp.detach(), adv, mask)
    aggregate(per_token, mask, "token_mean", **loss_normalizers(mask)).backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()

    seqs, targets, coef = [], [], []
    for rows, (first, s, e) in nodes_of(b).values():
        if e == s:
            continue
        p = int(b.prompt_lens[first])
        a = {float(adv[i, p + s]) for i in rows if mask[i, p + s] > 0}
        assert len(a) == 1  # every row that trains the segment gives it the node's advantage
        seqs.append(b.input_ids[first, :p + e].tolist())
        targets.append([0] * (p + s) + [1] * (e - s))
        coef.append((len(rows) if shared == "every_leaf" else 1) * a.pop())
    hand = build_batch([x[:1] for x in seqs], [x[1:] for x in seqs], [[0.0] * (len(x) - 1) for x in seqs],
                       list(range(len(seqs))), [False] * len(seqs), 2,
                       completion_loss_masks=[t[1:] for t in targets])
    hlp, _ = token_logprobs(model, hand.input_ids, hand.attention_mask, hand.loss_mask > 0)
    seg = (hlp * hand.loss_mask).sum(1)
    (-(torch.tensor(coef) * seg).sum() / mask.sum()).backward()
    for n, p in model.named_parameters():
        assert torch.allclose(got[n], p.grad, rtol=1e-4, atol=1e-7), n
    assert any(float(g.abs().max()) > 0 for g in got.values())
