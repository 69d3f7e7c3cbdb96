"""benchmarks/reproduce.py --task: the overrides that put both arms on an external task, the claims refused
there (and the notes' count of those that move), and the page's tables per task."""
from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from benchmark_scripts import load

ROOT = Path(__file__).resolve().parents[2]
rp = load("reproduce")


def test_an_external_task_replaces_the_recipes_task_and_keeps_the_method(capsys, tmp_path):
    """--task: both arms get the task's data, reward, reply length, evaluation and the model's own chat template,
    the method keeps its own plugins, the runs go under the task's directory, and resolving the baseline's config
    with the overrides gives the task recipe's config (steps aside)."""
    from upslope.config import load_config

    assert rp.main(["codapo", "--dry-run", "--seeds", "2", "--steps", "5", "--task", "chain_sum",
                    "--work", str(tmp_path)]) == 0
    cmds = [shlex.split(c) for c in capsys.readouterr().out.strip().splitlines()]
    assert len(cmds) == 4 and all(str(tmp_path / "chain_sum") in " ".join(c) for c in cmds)
    overrides = [a for a in cmds[1] if "=" in a and not a.startswith(("train.", "engine.", "run_dir", "log."))]
    assert "model.chat_template=null" in overrides and "rollout.max_new_tokens=128" in overrides
    base = load_config(ROOT / "recipes" / "headroom.yaml", [*overrides, f"run_dir={tmp_path}"]).model_dump()
    task = load_config(ROOT / "recipes" / "reasoning_gym_chain_sum.yaml", [f"run_dir={tmp_path}"]).model_dump()
    base["train"]["steps"] = task["train"]["steps"]
    assert base == task
    method = load_config(ROOT / "recipes" / "codapo.yaml", [*overrides, f"run_dir={tmp_path}"])
    assert method.algo.advantage.name == "codapo" and method.data.task == "reasoning_gym"


def test_each_task_given_is_a_row_of_its_own(capsys, tmp_path):
    """--task twice: a row for each task, its runs under that task's directory and labelled with it."""
    assert rp.main(["cero", "--dry-run", "--seeds", "1", "--steps", "5", "--task", "chain_sum",
                    "--task", "basic_arithmetic", "--work", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    dirs = [next(a for a in shlex.split(c) if a.startswith("run_dir=")) for c in out.strip().splitlines()]
    assert [Path(d.split("=", 1)[1]).relative_to(tmp_path).parts[0] for d in dirs] == [
        "chain_sum", "chain_sum", "basic_arithmetic", "basic_arithmetic"]
    assert [line.split(":")[0] for line in err.strip().splitlines()] == [
        "cero on chain_sum", "cero on basic_arithmetic", "in all"]


@pytest.mark.parametrize("method, why", [
    ("arena", "arena's recipe arena is not the arith task scored by its own verifier"),  # a reward of its own
    ("saw", "saw's recipe saw is not the arith task"),  # reweights reward components the task's verifier lacks
    ("progress_sql", "progress_sql's recipe progress_sql is not the arith task"),  # an environment and its task
    ("arkd", "arkd runs `upslope distill`"),
    ("ads", "ads's recipe ads sets data.sampler.options.cluster_key=carries, a field of the arith task's examples"),
    ("td_grokking", r"td_grokking's recipe td_grokking does not set up on chain_sum \(data.sampler td_grokking: "
                    "no decomposition for task 'reasoning_gym'")])  # its sampler decomposes arith operands
def test_a_claim_that_cannot_move_to_another_task_is_refused(method, why):
    with pytest.raises(SystemExit, match=why):
        rp.main([method, "--dry-run", "--task", "chain_sum"])


def test_the_notes_count_the_claims_that_move_to_another_task():
    """The notes' count of claims that can move to an external task is the one `--task` accepts."""
    movable = 0
    for method, claim in rp.METHODS.items():
        try:
            rp.check_portable(method, claim.recipe, claim.baseline, "chain_sum", claim.command)
            movable += 1
        except SystemExit:
            pass
    notes = " ".join((ROOT / "docs" / "results" / "reproductions_notes.md").read_text().split())
    assert f"{movable} claims can move, {len(rp.METHODS) - movable} cannot" in notes


def test_rows_of_several_tasks_render_per_task_and_side_by_side(tmp_path):
    """A table per task with its own verdict counts, the methods run on both tasks side by side, the task in the
    command and in the plot's label."""
    claim = rp.Claim("codapo", "headroom", "eval/accuracy", "higher", "CoDaPO")
    own = rp.row_for("codapo", claim, {"eval/accuracy": {"method": [0.5, 0.52, 0.54], "baseline": [0.3, 0.32, 0.34]}},
                     steps=10, seeds=[0, 1, 2], command="own", cpu_s=360.0)
    ext = {**rp.row_for("codapo", claim, {"eval/accuracy": {"method": [0.6, 0.7, 0.6, 0.7, 0.65],
                                                            "baseline": [0.6, 0.7, 0.62, 0.68, 0.65]}},
                        steps=20, seeds=[0, 1, 2, 3, 4], command="ext", cpu_s=3240.0), "task": "chain_sum"}
    other = {**own, "method": "denoise", "command": "den"}
    page = rp.render([own, ext, other])
    own_at, ext_at = page.index("### upslope's own arithmetic"), page.index("### reasoning-gym chain_sum")
    assert own_at < page.index("| codapo | CoDaPO |") < ext_at < page.index("`ext`")
    assert "2 rows (2 methods): 2 reproduced, 0 not reproduced, 0 inconclusive." in page
    assert "1 row (1 method): 0 reproduced, 0 not reproduced, 1 inconclusive." in page
    side = page[page.index("### The same methods on each task"):]
    assert "| method | arith | chain_sum |" in side and "| codapo | +0.200 [" in side and "| denoise" not in side
    assert "+0.000 [" in side and "inconclusive (20 x 5)" in side
    assert "3 rows in all (2 methods)" in page and "Total CPU time of these rows: 1.10 h" in page
    pytest.importorskip("matplotlib")
    labels = [x[0] for x in rp.plot_rows([own, ext], tmp_path / "p.png")["eval/accuracy"]]
    assert labels == ["codapo (10 x 3)", "codapo on chain_sum (20 x 5)"]
