"""BMC's task tree (recursive k-means of the prompts' features) and its Thompson sampling down the tree,
against hand-made cases; its state round trip; the prompt features the trainer gives it, against the
tiny model's own forward; the trainer handing them over at set-up."""
from __future__ import annotations

import pytest
import torch

from upslope.data.bmc import ManifoldBandit, kmeans, task_tree
from upslope.errors import ConfigError
from upslope.registry import SAMPLERS

FEATURES = torch.tensor([[0.0], [0.1], [10.0], [10.1]])


def partition(labels: torch.Tensor) -> set[frozenset[int]]:
    return {frozenset(torch.nonzero(labels == c).flatten().tolist()) for c in labels.unique().tolist()}


def test_kmeans_and_the_tree_by_hand():
    assert partition(kmeans(FEATURES, 2, seed=0)) == {frozenset({0, 1}), frozenset({2, 3})}
    paths = task_tree(FEATURES, branches=2, depth=2, seed=0)
    assert partition(paths[:, 0]) == {frozenset({0, 1}), frozenset({2, 3})}
    assert partition(paths[:, 1]) == {frozenset({0}), frozenset({1}), frozenset({2}), frozenset({3})}
    assert task_tree(FEATURES, branches=8, depth=1, seed=0)[:, 0].unique().numel() == 4  # at most one node a prompt


def bandit(**options) -> ManifoldBandit:
    s = ManifoldBandit(4, seed=0, branches=2, depth=2, **options)
    s.set_features(FEATURES)
    return s


def test_thompson_sampling_goes_to_the_node_with_learning_signal():
    """Prompts 0 and 1 are always solved (100 of 100: p(1 - p) ~ 0.005 under the posterior), 2 and 3 half the
    time (p(1 - p) ~ 0.25): a step's first two picks are 2 and 3, the third from the solved node."""
    s = bandit()
    s.successes = torch.tensor([100.0, 100.0, 50.0, 50.0])
    s.trials = torch.full((4,), 100.0)
    assert sorted(s.next(2)) == [2, 3]
    got = s.next(3)
    assert sorted(got[:2]) == [2, 3] and got[2] in (0, 1)


def test_update_counts_feed_the_posteriors_and_the_leaf_prefers_the_least_sampled():
    s = ManifoldBandit(4, seed=0, branches=1, depth=1)  # one node: every pick is the leaf's least-sampled prompt
    s.set_features(FEATURES)
    s.update([1, 3], torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1]))
    assert s.trials.tolist() == [0.0, 2.0, 0.0, 2.0] and s.successes.tolist() == [0.0, 1.0, 0.0, 2.0]
    assert sorted(s.next(2)) == [0, 2]


def test_state_round_trip_and_missing_features():
    s = bandit()
    s.update([0, 2], torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.tensor([0, 0, 1, 1]))
    s.next(2)
    t = ManifoldBandit(4, seed=0, branches=2, depth=2)
    t.load_state_dict(s.state_dict())
    assert torch.equal(t.paths, s.paths) and t.next(3) == s.next(3)
    with pytest.raises(ConfigError, match="was given no prompt features"):
        ManifoldBandit(4).next(1)
    with pytest.raises(ConfigError, match="3 feature vectors for 4 prompts"):
        ManifoldBandit(4).set_features(FEATURES[:3])
    assert SAMPLERS.get("bmc").traits.features == "hidden_mean"


def test_prompt_features_are_the_mean_prompt_state(tiny_model_path, tmp_path):
    from upslope.config import load_config
    from upslope.train.learner.salience import prompt_features
    from upslope.train.learner.updater import Updater

    cfg = load_config(None, [f"model.name={tiny_model_path}", f"run_dir={tmp_path}", "train.precision=float32"])
    updater = Updater.from_config(cfg, tiny_model_path, "cpu")
    got = prompt_features(updater, [[11, 12, 13], [14, 15]], rows=2)  # one forward, the second row padded
    with torch.no_grad():
        h0 = updater.model.model(input_ids=torch.tensor([[11, 12, 13]])).last_hidden_state[0]
        h1 = updater.model.model(input_ids=torch.tensor([[14, 15]])).last_hidden_state[0]
    assert torch.allclose(got[0], h0.mean(0), atol=1e-5) and torch.allclose(got[1], h1.mean(0), atol=1e-5)
