"""A real two-node Ray cluster on this machine (ray.cluster_utils.Cluster): the head, and a second
node that alone has the custom resource `rollout`; a run with dist.worker_resources={rollout: 1}
joins the cluster by dist.address and its rollout worker is placed on the second node."""
from __future__ import annotations

from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402

from upslope.config import load_config  # noqa: E402
from upslope.train.trainers.rl import Trainer  # noqa: E402

TOY = Path(__file__).resolve().parents[1] / "fixtures" / "toy_rewards.py"


@pytest.mark.slow
def test_rollout_worker_runs_on_the_second_node(tiny_model_path, tmp_path):
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        second = cluster.add_node(num_cpus=1, resources={"rollout": 1})
        cluster.wait_for_nodes()
        cfg = load_config(None, [
            f"model.name={tiny_model_path}", "engine.name=hf", f"run_dir={tmp_path / 'run'}", "log.progress=false",
            "log.tensorboard=false", "log.plot=false", "rollout.prompts_per_step=2", "rollout.n=2",
            "rollout.max_new_tokens=4", "train.eval_before=false", "train.eval_after=false", "train.steps=1",
            "train.threads=1", f"reward=[{{name: '{TOY}:long_text'}}]", "dist.rollout_workers=1",
            f"dist.address={cluster.address}", "dist.worker_resources={rollout: 1}"])
        trainer = Trainer(cfg)
        try:
            node = ray.get(trainer.source.pipe.workers[0].node_id.remote())
            assert node == second.node_id != cluster.head_node.node_id
            trainer.run()
        finally:
            trainer.close()
        assert not ray.is_initialized()  # the run started the connection, so it closed it
    finally:
        ray.shutdown()
        cluster.shutdown()
