"""Rollout replay (fresh-anchored replay, ReRULE): admission, eviction, priority,
group ids, importance weights of replayed rows, and exact resume through a real tiny run."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from run_helpers import learning, metrics, trained

from upslope.algos.correction import importance_correction
from upslope.algos.replay import FreshAnchoredReplay, ReRULEReplay
from upslope.batch import build_batch
from upslope.cli import main
from upslope.config import load_config
from upslope.errors import ConfigError
from upslope.train.trainers.rl import Trainer

PAD = 2
TOY = Path(__file__).resolve().parents[1] / "fixtures" / "toy_rewards.py"


def make(advs: list[float], rewards: list[float] | None = None, n: int = 1, tag: int = 0):
    """A batch of len(advs) rows (groups of n), each 2 prompt + 3 completion tokens; token ids
    encode (tag, row) so rows can be recognised after replay."""
    rows = len(advs)
    b = build_batch([[5, 6]] * rows, [[100 + tag, 10 + i, 7] for i in range(rows)],
                    [[-0.1 * (i + 1)] * 3 for i in range(rows)], [i // n for i in range(rows)], [False] * rows, PAD)
    adv = torch.tensor(advs).unsqueeze(1) * b.loss_mask
    r = torch.tensor(rewards if rewards is not None else [0.0] * rows, dtype=torch.float32)
    return replace(b, advantages=adv, rewards=r, old_logprobs=torch.zeros_like(b.sampler_logprobs))


def ident(batch) -> list[tuple[int, int]]:
    """(tag, row) of each row."""
    return [(int(x[2]) - 100, int(x[3]) - 10) for x in batch.input_ids]


def test_fresh_anchored_admission_priority_and_group_ids():
    r = FreshAnchoredReplay(tau=4, rows=2, capacity=10)
    out, m = r.mix(make([0.5, -2.0, 0.0, 1.0], tag=0), step=0, pad_id=PAD)
    assert ident(out) == [(0, 0), (0, 1), (0, 2), (0, 3)] and m["replay/rows"] == 0
    assert len(r) == 3 and r.priority.tolist() == [0.5, 2.0, 1.0]  # the 0-advantage row is not stored
    fresh = make([0.3, 0.3, 0.1, 0.1], n=2, tag=1)
    out, m = r.mix(fresh, step=1, pad_id=PAD)
    # every fresh row kept, then the two largest |advantage| rows of step 0
    assert ident(out) == [(1, 0), (1, 1), (1, 2), (1, 3), (0, 1), (0, 3)]
    assert out.group_ids.tolist() == [0, 0, 1, 1, 2, 3]  # one new group per replayed rollout
    assert out.advantages[4].max() == 0.0 and out.advantages[4].min() == -2.0  # stored advantage kept
    assert torch.equal(out.sampler_logprobs[4, 2:5], torch.full((3,), -0.2))  # its sampler log-probs kept
    assert out.old_logprobs is None  # recomputed by the learner
    assert m == {"replay/rows": 2.0, "replay/mean_age": 1.0, "replay/buffer": 5.0}  # 1 left + 4 fresh


def test_fresh_anchored_age_eviction_and_capacity():
    r = FreshAnchoredReplay(tau=1, rows=8, capacity=3)
    r.mix(make([1.0, 3.0], tag=0), step=0, pad_id=PAD)
    r.mix(make([0.0], tag=1), step=5, pad_id=PAD)  # step 0 rows are 5 > tau old: evicted, none replayed
    assert len(r) == 0
    r.mix(make([0.1, 0.4, 0.2, 0.3], tag=2), step=6, pad_id=PAD)
    assert sorted(r.priority.tolist()) == pytest.approx([0.2, 0.3, 0.4])  # capacity keeps the top 3
    out, _ = r.mix(make([0.0], tag=3), step=7, pad_id=PAD)
    assert ident(out)[1:] == [(2, 1), (2, 3), (2, 2)]  # by |advantage|, largest first


def test_rerule_stores_hard_groups_and_replays_them_later():
    r = ReRULEReplay(hard_below=0.5, store_steps=2, replay_from=3, groups=1, capacity=8)
    # groups of 2: (1,1) easy, (0,0) no signal, (1,0) mean 0.5 not below, so nothing from step 0 ...
    r.mix(make([0, 0, 0, 0, 1, -1], [1, 1, 0, 0, 1, 0], n=2, tag=0), step=0, pad_id=PAD)
    assert len(r) == 0
    # ... step 1: groups of 4 with means 0.25 (hard, mixed) and 0.0
    r.mix(make([1.5, -.5, -.5, -.5, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0, 0], n=4, tag=1), step=1, pad_id=PAD)
    r.mix(make([1.5, -.5, -.5, -.5], [1, 0, 0, 0], n=4, tag=2), step=2, pad_id=PAD)  # past store_steps
    assert len(r) == 4 and r.born.tolist() == [1] * 4
    out, m = r.mix(make([1.0, -1.0], [1, 0], n=2, tag=3), step=3, pad_id=PAD)
    assert ident(out) == [(3, 0), (3, 1), (1, 0), (1, 1), (1, 2), (1, 3)]
    assert out.group_ids.tolist() == [0, 0, 1, 1, 1, 1]  # the replayed group stays one group
    assert m["replay/mean_age"] == 2.0 and len(r) == 0  # replayed once


def test_replayed_rows_get_truncated_importance_weights():
    """The off-policy correction of a replayed row is min(pi_now / pi_sampler, cap) per token."""
    r = FreshAnchoredReplay(rows=1)
    r.mix(make([1.0], tag=0), step=0, pad_id=PAD)
    out, _ = r.mix(make([0.5], tag=1), step=1, pad_id=PAD)
    now = torch.zeros_like(out.sampler_logprobs)
    now[1, 2:5] = torch.tensor([-0.1 + 0.5, -0.1 - 0.5, -0.1 + 2.0])  # the policy moved since step 0
    w, _, _ = importance_correction(now, out.sampler_logprobs, out.loss_mask, level="token", cap=2.0)
    assert w[1, 2:5].tolist() == pytest.approx([1.6487213, 0.6065307, 2.0])


@pytest.mark.parametrize("cls", [FreshAnchoredReplay, ReRULEReplay])
def test_state_round_trip(cls):
    a = cls(**({"store_steps": 2, "replay_from": 2} if cls is ReRULEReplay else {"rows": 2}))
    for s in range(2):
        a.mix(make([1.0, -1.0, 0.5, -0.5], [1, 0, 0, 0], n=4, tag=s), step=s, pad_id=PAD)
    b = cls(**({"store_steps": 2, "replay_from": 2} if cls is ReRULEReplay else {"rows": 2}))
    b.load_state_dict(a.state_dict())
    for s in range(2, 4):
        x, _ = a.mix(make([2.0, -2.0, 0.5, -0.5], [1, 0, 0, 0], n=4, tag=s), step=s, pad_id=PAD)
        y, _ = b.mix(make([2.0, -2.0, 0.5, -0.5], [1, 0, 0, 0], n=4, tag=s), step=s, pad_id=PAD)
        assert torch.equal(x.input_ids, y.input_ids) and torch.equal(x.advantages, y.advantages)
        assert torch.equal(x.group_ids, y.group_ids)


def test_replay_config_is_checked():
    assert load_config(None, []).algo.replay is None
    assert load_config(None, ["algo.replay={name: rerule}"]).algo.replay.name == "rerule"
    with pytest.raises(ConfigError, match="algo.replay.name: unknown replay 'fresh'"):
        load_config(None, ["algo.replay={name: fresh}"])


@pytest.mark.parametrize("override,expected", [
    ("algo.replay={name: fresh_anchored, options: {tua: 3}}",
     "algo.replay.options.tua: unknown option for replay 'fresh_anchored' (did you mean 'tau'?)"),
    ("data.sampler={name: cero, options: {saturation: many}}", "data.sampler.options.saturation: ")])
def test_bad_plugin_options_fail_before_the_model_loads(override, expected, tmp_path, capsys):
    assert main(["train", override, f"run_dir={tmp_path / 'run'}", "log.progress=false"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("upslope: error: ") and expected in err


def run(overrides: list[str]) -> tuple[Trainer, list[dict]]:
    trainer = trained(Trainer(load_config(None, overrides)))
    return trainer, metrics(trainer.cfg.run_dir)


@pytest.mark.slow
def test_replay_and_cero_resume_exactly_in_a_real_run(tiny_model_path, tmp_path):
    """4 steps straight == 2 steps, stop, resume, 2 steps: the replay buffer and the CERO
    sampler's posterior are restored (same metrics, replayed rows included)."""
    common = [f"model.name={tiny_model_path}", "engine.name=hf", "log.progress=false", "log.tensorboard=false",
              "rollout.prompts_per_step=2", "rollout.n=4", "rollout.max_new_tokens=6", "train.eval_before=false",
              "train.eval_after=false", "train.micro_batch_tokens=512", "train.steps=4", "train.deterministic=true",
              "train.seed=3", "optim.lr=1e-3", "train.save_every=2", "train.threads=1",
              f"reward=[{{name: '{TOY}:long_text'}}]", "algo.replay={name: fresh_anchored, options: {rows: 3}}",
              "algo.correction={level: token, cap: 2.0}",
              "data.sampler={name: cero, options: {threshold: 0.2, max_groups: 2}}"]
    first, straight = run([*common, f"run_dir={tmp_path / 'a'}"])
    run([*common, f"run_dir={tmp_path / 'b'}", "train.stop_after=2"])
    second, split = run([*common, f"run_dir={tmp_path / 'b'}", "train.resume=latest"])
    assert [m["replay/rows"] for m in straight] == [0.0, 3.0, 3.0, 3.0]
    # the sampler heard every sample of the 4 steps (2 prompts x 4), the resumed one through its checkpoint
    for trainer in (first, second):
        assert float(trainer.sampler.trials.sum()) == 32.0 and trainer.sampler.draws == 4
    assert torch.equal(first.sampler.successes, second.sampler.successes)

    assert learning(straight) == learning(split)
