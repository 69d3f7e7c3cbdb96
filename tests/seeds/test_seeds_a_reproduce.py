"""benchmarks/reproduce.py: the t quantile, Welch's interval and the verdict on hand-made numbers,
the generated page, the dry run's commands, and one tiny real reproduction end to end."""
from __future__ import annotations

import importlib.util
import json
import math
import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("reproduce", ROOT / "benchmarks" / "reproduce.py")
rp = importlib.util.module_from_spec(_spec)
sys.modules["reproduce"] = rp
_spec.loader.exec_module(rp)


@pytest.mark.parametrize("df,q", [(1, 12.706205), (2, 4.302653), (4, 2.776445), (10, 2.228139), (30, 2.042272)])
def test_t_quantile_matches_tables(df, q):
    assert rp.t_quantile(0.975, df) == pytest.approx(q, rel=2e-5)


def test_welch_interval_by_hand():
    # equal variances 0.0025, n = 3 each: se = sqrt(2 * 0.0025 / 3), df = 4, t = 2.776445
    diff, lo, hi = rp.welch_interval([0.3, 0.35, 0.4], [0.2, 0.25, 0.3])
    half = 2.776445 * math.sqrt(2 * 0.0025 / 3)
    assert diff == pytest.approx(0.1) and lo == pytest.approx(0.1 - half, abs=1e-6)
    assert hi == pytest.approx(0.1 + half, abs=1e-6)
    # unequal: va = 1.6667/4, vb = 0.125/2; Welch-Satterthwaite df = 3.7166 lies between t(3) and t(4)
    diff, lo, hi = rp.welch_interval([1, 2, 3, 4], [1, 1.5])
    se = math.sqrt(statistics.variance([1, 2, 3, 4]) / 4 + 0.125 / 2)
    assert diff == pytest.approx(1.25)
    assert 2.776445 * se < (hi - lo) / 2 < 3.182446 * se
    assert rp.t_quantile(0.975, 3.7166) * se == pytest.approx((hi - lo) / 2, rel=1e-4)
    assert rp.welch_interval([0.5, 0.5], [0.25, 0.25]) == (0.25, 0.25, 0.25)  # no spread: a point
    with pytest.raises(ValueError, match="at least 2 seeds"):
        rp.welch_interval([0.5], [0.1, 0.2])


@pytest.mark.parametrize("lo,hi,direction,expected", [
    (0.05, 0.2, "higher", "reproduced"), (-0.2, -0.05, "higher", "not reproduced"),
    (-0.01, 0.2, "higher", "inconclusive"), (-0.2, -0.05, "lower", "reproduced"),
    (0.05, 0.2, "lower", "not reproduced"), (0.0, 0.1, "higher", "inconclusive"), (0.0, 0.0, "lower", "inconclusive")])
def test_verdict(lo, hi, direction, expected):
    assert rp.verdict(lo, hi, direction) == expected


def test_row_and_render():
    claim = rp.Claim("cero", "headroom", "eval/accuracy", "higher", "CERO")
    row = rp.row_for("cero", claim, {"method": [0.5, 0.52, 0.54], "baseline": [0.3, 0.32, 0.34]}, steps=60,
                     seeds=[0, 1, 2], command="python benchmarks/reproduce.py cero", cpu_s=1800.0)
    assert row["verdict"] == "reproduced" and row["arms"]["method"]["sd"] == pytest.approx(0.02)
    old = {**row, "verdict": "inconclusive", "cpu_s": 99.0}
    other = {**row, "method": "ads", "cpu_s": 1800.0, "diff": -0.2, "ci95": [-0.25, -0.15], "verdict": "not reproduced"}
    page = rp.render([old, row, other], notes="## Task\nnotes here")
    assert "## Task\nnotes here" in page
    lines = [x for x in page.splitlines() if x.startswith("| cero ")]
    assert len(lines) == 1 and "| reproduced |" in lines[0]  # the latest row of a method wins
    assert "0.520 ± 0.020 | 0.320 ± 0.020 (headroom) | +0.200 [+0.155, +0.245]" in lines[0]
    assert "| 60 x 3 | 0.50 h | `python benchmarks/reproduce.py cero` |" in lines[0]
    assert "| ads " in page and "| not reproduced |" in page
    assert "Total CPU time of these rows: 1.00 h (3600 s" in page
    assert "No reproduction has run yet" in rp.render([])


def test_every_method_names_existing_recipes():
    for claim in rp.METHODS.values():
        assert (ROOT / "recipes" / f"{claim.recipe}.yaml").is_file() and claim.direction in ("higher", "lower")
        assert (ROOT / "recipes" / f"{claim.baseline}.yaml").is_file()


def test_dry_run_interleaves_arms_with_the_same_seed(capsys):
    assert rp.main(["cero", "--dry-run", "--seeds", "2", "--steps", "5", "--set", "rollout.n=4"]) == 0
    cmds = capsys.readouterr().out.strip().splitlines()
    assert [("cero.yaml" in c, "train.seed=0" in c and "engine.seed=0" in c) for c in cmds] == [
        (True, True), (False, True), (True, False), (False, False)]
    assert all("headroom.yaml" in c for c in cmds[1::2]) and all("train.seed=1 engine.seed=1" in c for c in cmds[2:])
    assert all("train.steps=5" in c and c.endswith("rollout.n=4") for c in cmds)


def test_a_pass_at_k_claim_evaluates_by_sampling(capsys):
    assert rp.main(["boundary_curriculum", "--dry-run", "--seeds", "2", "--steps", "5"]) == 0
    cmds = capsys.readouterr().out.strip().splitlines()
    assert len(cmds) == 4 and all("eval.n=8 eval.temperature=1.0 'eval.k=[1,8]'" in c for c in cmds)
    assert rp.METHODS["boundary_curriculum"].metric == "eval/pass@8"


def test_a_method_of_another_command_runs_it_against_upslope_train(capsys):
    assert rp.main(["corp", "--dry-run", "--seeds", "2", "--steps", "5"]) == 0
    cmds = capsys.readouterr().out.strip().splitlines()
    assert [c.split(" -m upslope.cli ")[1].split()[0] for c in cmds] == ["randopt", "train", "randopt", "train"]
    assert all("corp.yaml" in c for c in cmds[::2]) and all("headroom.yaml" in c for c in cmds[1::2])


def test_a_finished_identical_run_is_reused(tmp_path):
    """run_arm on a real subprocess that writes a run's files: reused while command and commit
    are unchanged, rerun with fresh or a changed command; a failing run is one line."""
    run_dir = tmp_path / "arm"

    def cmd(acc: float) -> list[str]:
        code = (f"import json, pathlib; p = pathlib.Path({str(run_dir)!r}); p.mkdir(parents=True, exist_ok=True); "
                f"(p / 'metrics.jsonl').write_text(json.dumps({{'step': 2, 'eval/accuracy': {acc}}}) + '\\n'); "
                f"(p / 'checkpoints').mkdir()")
        return [sys.executable, "-c", code]

    assert rp.run_arm(cmd(0.25), run_dir, "eval/accuracy") == (0.25, False)
    assert not (run_dir / "checkpoints").exists() and (run_dir / "reproduce_stamp.json").exists()
    assert rp.run_arm(cmd(0.25), run_dir, "eval/accuracy") == (0.25, True)
    assert rp.run_arm(cmd(0.25), run_dir, "eval/accuracy", fresh=True) == (0.25, False)
    assert rp.run_arm(cmd(0.5), run_dir, "eval/accuracy") == (0.5, False)  # another command
    with pytest.raises(SystemExit, match=f"the run in {run_dir} failed: .*ZeroDivisionError"):
        rp.run_arm([sys.executable, "-c", "1 / 0"], run_dir, "eval/accuracy")
    base = rp.arm_dir(tmp_path, "cero", "baseline", "headroom", 60, ["a=1"], 0)
    assert base == rp.arm_dir(tmp_path, "ads", "baseline", "headroom", 60, ["a=1"], 0)  # shared by rows
    assert base != rp.arm_dir(tmp_path, "ads", "baseline", "headroom", 30, ["a=1"], 0)


def test_one_seed_is_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        rp.main(["cero", "--seeds", "1"])
    assert exc.value.code == 2 and "at least 2 seeds" in capsys.readouterr().err


@pytest.mark.slow
def test_tiny_reproduction_end_to_end(tiny_model_path, tmp_path):
    """2 steps x 2 seeds x 2 arms of real `upslope train` runs on the tiny model: a row with four
    measured values, its interval and verdict, and a page rendered from it."""
    rows, doc = tmp_path / "rows.json", tmp_path / "reproductions.md"
    tiny = [f"model.name={tiny_model_path}", "engine.name=hf", "rollout.prompts_per_step=2", "rollout.n=2",
            "rollout.max_new_tokens=4", "eval.limit=4", "train.micro_batch_tokens=512", "train.threads=1",
            "data.options.count=50"]
    args = ["cero", "--steps", "2", "--seeds", "2", "--work", str(tmp_path / "runs"), "--rows", str(rows),
            *[f"--set={x}" for x in tiny]]
    assert rp.main(args) == 0
    (row,) = json.loads(rows.read_text())
    assert len(row["arms"]["method"]["values"]) == 2 and len(row["arms"]["baseline"]["values"]) == 2
    assert row["verdict"] in ("reproduced", "not reproduced", "inconclusive") and row["cpu_s"] > 0
    for arm, recipe in (("method", "cero"), ("baseline", "headroom")):
        for s in (0, 1):
            run_dir = rp.arm_dir(tmp_path / "runs", "cero", arm, recipe, 2, tiny, s)
            recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
            assert recs[-1]["eval/accuracy"] == row["arms"][arm]["values"][s]
            assert not (run_dir / "checkpoints").exists()  # deleted once the metric is read
    assert row["reused_runs"] == 0
    assert rp.main(args) == 0  # the same command again: every finished arm is reused, none runs
    again = json.loads(rows.read_text())[-1]
    assert again["reused_runs"] == 4 and again["arms"] == row["arms"] and again["cpu_s"] < 5
    assert rp.main(["--render", "--rows", str(rows), "--doc", str(doc)]) == 0
    assert "| cero |" in doc.read_text()


def test_committed_page_is_the_generated_one():
    """docs/reproductions.md is generated: regenerate with `python benchmarks/reproduce.py --render`."""
    notes = rp.NOTES.read_text() if rp.NOTES.exists() else ""
    assert rp.DOC.read_text() == rp.render(rp.load_rows(rp.ROWS), notes)
