"""benchmarks/reproduce.py: the t quantile, Welch's interval and the verdict on hand-made numbers,
the generated page, the dry run's commands, and one tiny real reproduction end to end."""
from __future__ import annotations

import json
import math
import shlex
import statistics
import sys
from pathlib import Path

import pytest
from benchmark_scripts import load
from run_helpers import metrics

ROOT = Path(__file__).resolve().parents[2]
rp = load("reproduce")


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
    row = rp.row_for("cero", claim, {"eval/accuracy": {"method": [0.5, 0.52, 0.54], "baseline": [0.3, 0.32, 0.34]}},
                     steps=60, seeds=[0, 1, 2], command="python benchmarks/reproduce.py cero", cpu_s=1800.0)
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
    assert "2 rows (2 methods): 1 reproduced, 1 not reproduced, 0 inconclusive." in page
    assert page.index("| cero ") < page.index("| ads ")  # in the order of METHODS, not of the runs
    # a row of another protocol (steps) is shown beside the method's earlier one, not instead of it
    short = {**row, "steps": 10, "cpu_s": 900.0, "verdict": "inconclusive"}
    page = rp.render([old, row, other, short])
    assert [x.split(" | ")[7] for x in page.splitlines() if x.startswith("| cero ")] == ["10 x 3", "60 x 3"]
    assert "3 rows (2 methods): 1 reproduced, 1 not reproduced, 1 inconclusive." in page
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
    assert rp.main(["randopt", "--dry-run", "--seeds", "2", "--steps", "5"]) == 0
    cmds = capsys.readouterr().out.strip().splitlines()
    assert [c.split(" -m upslope.cli ")[1].split()[0] for c in cmds] == ["randopt", "train", "randopt", "train"]
    assert all("randopt.yaml" in c for c in cmds[::2]) and all("headroom.yaml" in c for c in cmds[1::2])
    assert rp.main(["corp", "--dry-run", "--seeds", "2", "--steps", "5"]) == 0  # CoRP's claim: above RandOpt
    cmds = capsys.readouterr().out.strip().splitlines()
    assert [c.split(" -m upslope.cli ")[1].split()[0] for c in cmds] == ["randopt"] * 4
    assert all("corp.yaml" in c for c in cmds[::2]) and all("randopt.yaml" in c for c in cmds[1::2])


def test_a_finished_identical_run_is_reused(tmp_path):
    """run_arm on a real subprocess that writes a run's files: reused while command and commit
    are unchanged, rerun with fresh or a changed command; a failing run is one line."""
    run_dir = tmp_path / "arm"

    def cmd(acc: float) -> list[str]:
        code = (f"import json, pathlib; p = pathlib.Path({str(run_dir)!r}); p.mkdir(parents=True, exist_ok=True); "
                f"(p / 'metrics.jsonl').write_text(json.dumps({{'step': 2, 'eval/accuracy': {acc}}}) + '\\n'); "
                f"(p / 'checkpoints').mkdir()")
        return [sys.executable, "-c", code]

    acc = ["eval/accuracy"]
    assert rp.run_arm(cmd(0.25), run_dir, acc) == ({"eval/accuracy": 0.25}, False)
    assert not (run_dir / "checkpoints").exists() and (run_dir / "reproduce_stamp.json").exists()
    assert rp.run_arm(cmd(0.25), run_dir, acc) == ({"eval/accuracy": 0.25}, True)
    assert rp.run_arm(cmd(0.25), run_dir, acc, fresh=True) == ({"eval/accuracy": 0.25}, False)
    assert rp.run_arm(cmd(0.5), run_dir, acc) == ({"eval/accuracy": 0.5}, False)  # another command
    # a teacher keeps its checkpoint, and is reused only while it still has one
    assert rp.run_arm(cmd(0.5), run_dir, acc, keep_checkpoints=True)[1] is False
    assert (run_dir / "checkpoints").is_dir() and rp.run_arm(cmd(0.5), run_dir, acc, keep_checkpoints=True)[1]
    (run_dir / "checkpoints").rmdir()
    assert rp.run_arm(cmd(0.5), run_dir, acc, keep_checkpoints=True)[1] is False
    with pytest.raises(SystemExit, match=f"the run in {run_dir} failed: .*ZeroDivisionError"):
        rp.run_arm([sys.executable, "-c", "1 / 0"], run_dir, acc)
    base = rp.arm_dir(tmp_path, "cero", "baseline", "headroom", 60, ["a=1"], 0)
    assert base == rp.arm_dir(tmp_path, "ads", "baseline", "headroom", 60, ["a=1"], 0)  # shared by rows
    assert base != rp.arm_dir(tmp_path, "ads", "baseline", "headroom", 30, ["a=1"], 0)


def test_the_arm_ledger_serves_the_same_command_at_the_same_code_from_another_directory(tmp_path, monkeypatch):
    """An arm recorded in the ledger is taken from it by a run in another work directory (its run_dir differs,
    the ledger keys the command without it and names the recipe relative to the checkout); a changed command
    or code stamp, or --fresh, runs it (a real subprocess that counts its launches) and records it again."""
    launches, ledger = tmp_path / "launches", tmp_path / "rows_arms.json"
    recipe = str(rp.ROOT / "recipes" / "headroom.yaml")

    def cmd(run_dir: Path, acc: float) -> list[str]:  # the run writes where its run_dir= argument says
        code = (f"import json, pathlib, sys; open({str(launches)!r}, 'a').write('x'); "
                "p = pathlib.Path(sys.argv[-1].split('=', 1)[1]); p.mkdir(parents=True, exist_ok=True); "
                f"(p / 'metrics.jsonl').write_text(json.dumps({{'step': 2, 'eval/accuracy': {acc}}}) + '\\n')")
        return [sys.executable, "-c", code, recipe, f"run_dir={run_dir}"]

    acc = ["eval/accuracy"]
    first, second = tmp_path / "work1" / "seed0", tmp_path / "work2" / "seed0"
    assert rp.run_arm(cmd(first, 0.25), first, acc, ledger=ledger) == ({"eval/accuracy": 0.25}, False)
    (rec,) = json.loads(ledger.read_text())
    assert rec["code"] == rp.git_head() and rec["metrics"] == {"eval/accuracy": 0.25} and rec["cpu_s"] >= 0
    assert rec["cpu"] == rp.cpu_name() != ""  # CPU times are only comparable on the same processor
    assert rec["args"][-1] == "recipes/headroom.yaml" and not any(a.startswith("run_dir=") for a in rec["args"])
    assert rp.run_arm(cmd(second, 0.25), second, acc, ledger=ledger) == ({"eval/accuracy": 0.25}, True)
    assert launches.read_text() == "x" and not second.exists()  # nothing ran
    assert rp.run_arm(cmd(second, 0.5), second, acc, ledger=ledger) == ({"eval/accuracy": 0.5}, False)  # another command
    assert rp.run_arm(cmd(tmp_path / "w", 0.5), tmp_path / "w", acc, fresh=True, ledger=ledger)[1] is False
    assert launches.read_text() == "xxx" and len(json.loads(ledger.read_text())) == 3
    assert rp.recorded(ledger, cmd(first, 0.25), ["eval/pass@8"]) is None  # a metric the record lacks
    monkeypatch.setattr(rp, "git_head", lambda: "another-code")
    assert rp.recorded(ledger, cmd(first, 0.25), acc) is None  # another code stamp
    third = tmp_path / "work3" / "seed0"
    assert rp.run_arm(cmd(third, 0.25), third, acc, ledger=ledger)[1] is False
    assert launches.read_text() == "xxxx" and len(json.loads(ledger.read_text())) == 4


def test_the_dry_run_comments_out_the_runs_a_finished_identical_run_serves(tmp_path, capsys):
    """A dry run counts what is still to make: an arm the ledger records at this code, and one whose run
    directory holds a finished stamped run, are printed as `# taken: ...`; the rest as commands."""
    ledger, work = tmp_path / "arms.json", tmp_path / "work"
    args = ["cero", "--dry-run", "--seeds", "2", "--steps", "5", "--work", str(work), "--arms", str(ledger)]
    assert rp.main(args) == 0
    out, err = capsys.readouterr()
    cmds = [shlex.split(c) for c in out.strip().splitlines()]
    assert len(cmds) == 4
    assert err.strip() == "cero: 4 of 4 runs to make, 0 taken from the ledger or their run directories"
    rp.record(ledger, cmds[1], {"eval/accuracy": 0.5}, 1.0)  # seed 0's baseline, recorded from another directory
    method_dir = Path(next(a for a in cmds[2] if a.startswith("run_dir=")).split("=", 1)[1])  # seed 1's method arm
    method_dir.mkdir(parents=True)
    (method_dir / "metrics.jsonl").write_text(json.dumps({"step": 5, "eval/accuracy": 0.25}) + "\n")
    (method_dir / "reproduce_stamp.json").write_text(json.dumps({"args": cmds[2][1:], "commit": rp.git_head()}))
    assert rp.main(args) == 0
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    assert [line.startswith("# taken: ") for line in lines] == [False, True, True, False]
    assert [shlex.split(line.removeprefix("# taken: ")) for line in lines] == cmds
    assert err.strip() == "cero: 2 of 4 runs to make, 2 taken from the ledger or their run directories"
    assert rp.main([*args, "--fresh"]) == 0 and "# taken" not in capsys.readouterr().out  # --fresh reruns all


def test_a_dry_run_over_several_rows_lists_each_shared_run_once(tmp_path, capsys):
    """Rows that share runs: SR-PPO and the boundary curriculum share the pass@8 baseline, SR-PPO's critic
    ablation runs SR-PPO's own method arm. A later row's run that an earlier row already makes is printed as
    `# planned above: ...` (the same command in another run directory), and the distinct count is given."""
    args = ["sr_ppo", "sr_ppo_critic", "boundary_curriculum", "--dry-run", "--seeds", "2", "--steps", "5",
            "--work", str(tmp_path / "work"), "--arms", str(tmp_path / "arms.json")]
    assert rp.main(args) == 0
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    shared = [line.startswith("# planned above: ") for line in lines]
    assert shared == [False] * 4 + [True, False, True, False] + [False, True, False, True]
    keys = [rp.ledger_args(shlex.split(line.removeprefix("# planned above: "))) for line in lines]
    assert keys[4] == keys[0] and keys[6] == keys[2] and keys[9] == keys[1] and keys[11] == keys[3]
    assert len({tuple(k) for k in keys}) == 8
    assert err.strip().splitlines() == [
        "sr_ppo: 4 of 4 runs to make, 0 taken from the ledger or their run directories",
        "sr_ppo_critic: 2 of 4 runs to make, 0 taken from the ledger or their run directories, 2 planned by a "
        "row above",
        "boundary_curriculum: 2 of 4 runs to make, 0 taken from the ledger or their run directories, 2 planned "
        "by a row above",
        "in all: 8 distinct runs to make"]


def test_drpos_baseline_is_the_command_of_dppos_method_arm(tmp_path, capsys):
    """DRPO's claimed baseline is DPPO at the same two optimiser steps a batch: the very runs DPPO's row makes."""
    assert rp.main(["dppo", "drpo", "--dry-run", "--seeds", "1", "--steps", "5", "--work", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.startswith("# planned above: ") for line in lines] == [False, False, False, True]
    assert rp.ledger_args(shlex.split(lines[3].removeprefix("# planned above: "))) == rp.ledger_args(
        shlex.split(lines[0]))
    assert "dppo.yaml" in lines[0] and "drpo.yaml" in lines[2]


def test_an_unknown_method_is_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        rp.main(["cero", "nosuch", "--dry-run"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "METHOD: no such method 'nosuch'; expected one of: " in err and "cero" in err


def test_the_cpu_name_is_the_processors_model_name():
    """The ledger's `cpu` is the model name Linux reports for the processor (lscpu's 'Model name')."""
    info = Path("/proc/cpuinfo")
    if not info.exists():
        pytest.skip("no /proc/cpuinfo on this system")
    names = {line.split(":", 1)[1].strip() for line in info.read_text().splitlines() if line.startswith("model name")}
    assert rp.cpu_name() in names and rp.cpu_name()


def test_two_processes_asking_for_one_shared_run_make_it_once(tmp_path):
    """Two reproductions side by side that share a baseline directory: the second waits for the first's
    run (a real subprocess that takes a moment and counts its launches) and reuses it."""
    import threading

    run_dir, launches = tmp_path / "baselines" / "headroom" / "seed0", tmp_path / "launches"
    code = ("import json, pathlib, time; time.sleep(0.5); "
            f"open({str(launches)!r}, 'a').write('x'); p = pathlib.Path({str(run_dir)!r}); "
            "p.mkdir(parents=True, exist_ok=True); "
            "(p / 'metrics.jsonl').write_text(json.dumps({'step': 2, 'eval/accuracy': 0.5}) + '\\n')")
    got: list[tuple[dict[str, float], bool]] = []
    threads = [threading.Thread(target=lambda: got.append(rp.run_arm([sys.executable, "-c", code], run_dir,
                                                                     ["eval/accuracy"])))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert launches.read_text() == "x"
    assert sorted(reused for _, reused in got) == [False, True]
    assert all(values == {"eval/accuracy": 0.5} for values, _ in got)


def test_the_run_stamp_follows_the_code_not_the_docs(tmp_path, monkeypatch):
    """A commit touching only docs keeps the stamp (shared baselines stay reusable while rows are written
    up); an uncommitted or committed change to the package or a recipe changes it."""
    import subprocess

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    for path, text in {"upslope/a.py": "x = 1\n", "recipes/r.yaml": "a: 1\n", "pyproject.toml": "[x]\n",
                       "docs/d.md": "one\n"}.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    git("init", "-q")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    monkeypatch.setattr(rp, "ROOT", tmp_path)
    first = rp.git_head()
    assert first != "unknown" and not first.endswith("+dirty")
    (tmp_path / "docs/d.md").write_text("two\n")
    assert rp.git_head() == first  # an uncommitted docs edit
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "docs")
    assert rp.git_head() == first  # a docs commit
    (tmp_path / "recipes/r.yaml").write_text("a: 2\n")
    assert rp.git_head() == first + "+dirty"
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "recipe")
    assert rp.git_head() not in (first, first + "+dirty")


def test_a_mean_metric_averages_every_record(tmp_path):
    f = tmp_path / "metrics.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in [{"step": 1, "mismatch": 0.1}, {"step": 2, "mismatch": 0.3},
                                                    {"step": 2, "eval/accuracy": 0.5}, {"step": 3, "mismatch": 0.2}]))
    assert rp.final_metric(f, "mismatch") == 0.2  # the last record holding it
    assert rp.final_metric(f, "mean:mismatch") == pytest.approx(0.2)  # (0.1 + 0.3 + 0.2) / 3
    assert rp.final_metric(f, "eval/accuracy") == 0.5
    with pytest.raises(KeyError, match="no record holds 'eval/ece'"):
        rp.final_metric(f, "mean:eval/ece")


def test_further_metrics_get_their_own_interval_and_verdict():
    """A calibration claim: ece lower (reproduced), accuracy beside it (equal: inconclusive)."""
    claim = rp.METHODS["calibration"]
    values = {"eval/ece": {"method": [0.10, 0.12, 0.14], "baseline": [0.30, 0.32, 0.34]},
              "eval/brier": {"method": [0.2, 0.2, 0.2], "baseline": [0.2, 0.2, 0.2]},
              "eval/accuracy": {"method": [0.30, 0.40, 0.50], "baseline": [0.31, 0.41, 0.49]}}
    row = rp.row_for("calibration", claim, values, steps=60, seeds=[0, 1, 2], command="c", cpu_s=10.0)
    assert row["metric"] == "eval/ece" and row["verdict"] == "reproduced" and row["diff"] == pytest.approx(-0.2)
    half = 2.776445 * math.sqrt(2 * 0.0004 / 3)  # equal variances 0.0004, n = 3: df = 4
    assert row["ci95"] == pytest.approx([-0.2 - half, -0.2 + half], abs=1e-6)
    also = {a["metric"]: a for a in row["also"]}
    assert also["eval/brier"]["verdict"] == "inconclusive" and also["eval/brier"]["ci95"] == [0.0, 0.0]
    assert also["eval/accuracy"]["verdict"] == "inconclusive" and also["eval/accuracy"]["direction"] == "higher"
    assert also["eval/accuracy"]["diff"] == pytest.approx(-0.0033333, abs=1e-6)
    page = rp.render([row])
    lines = [x for x in page.splitlines() if x.startswith("| calibration")]
    assert len(lines) == 3 and "eval/ece (lower)" in lines[0] and "| reproduced |" in lines[0]
    assert lines[2].startswith("| calibration (also) | | eval/accuracy (higher) | 0.400 ± 0.100 |")


# every metric a claim may name: what `upslope eval` reports (eval/...), what `upslope rm`'s evaluation
# reports (eval/rm_...) and the step metrics
EVAL_KEYS = {"accuracy", "mean_reward", "mean_length", "truncated_frac", "pass@1", "pass@8", "maj@8", "ece", "brier",
             "confidence_stated", "coverage", "selective_risk", "aurc",
             "agent/tool_calls"}  # multi-turn runs' evaluation summaries add the agent/* means
EVAL_KEYS |= {"rm_accuracy", "rm_margin", "rm_score_mean", "rm_ece", "rm_brier"}
CALIBRATION_KEYS = {"ece": "confidence_pattern", "brier": "confidence_pattern", "confidence_stated": "confidence_pattern",
                    "coverage": "abstain_pattern", "selective_risk": "abstain_pattern", "aurc": "abstain_pattern"}


@pytest.mark.parametrize("method", sorted(rp.METHODS))
def test_every_claim_names_a_metric_its_runs_log(method):
    """Each claimed metric is one the runs write: an eval key, or the step metric `mismatch`; a calibration
    or selective metric needs both arms' recipes to set the evaluation pattern that turns it on."""
    from upslope.config import load_config

    claim = rp.METHODS[method]
    for metric, direction in claim.metrics():
        name = metric.removeprefix("mean:")
        assert direction in ("higher", "lower")
        assert name == "mismatch" or (name.startswith("eval/") and name[5:] in EVAL_KEYS), metric
        if name[5:] in CALIBRATION_KEYS:
            for recipe in (claim.recipe, claim.baseline):
                cfg = load_config(ROOT / "recipes" / f"{recipe}.yaml", list(claim.overrides))
                assert getattr(cfg.eval, CALIBRATION_KEYS[name[5:]]), (recipe, metric)


def test_the_dry_run_of_every_claim(capsys):
    """Every claim's commands: method and baseline interleaved with the claim's overrides; the
    distillation claim trains its teacher first and hands both arms that run directory."""
    for method, claim in rp.METHODS.items():
        assert rp.main([method, "--dry-run", "--seeds", "2", "--steps", "3", "--work", "/tmp/w"]) == 0
        cmds = capsys.readouterr().out.strip().splitlines()
        if claim.teacher:
            teacher, cmds = cmds[0], cmds[1:]
            assert f" train {shlex.quote(f'{ROOT}/recipes/{claim.teacher}.yaml')} train.seed=0 " in teacher
            assert all(f"distill.teacher=/tmp/w/teachers/{claim.teacher}-" in c for c in cmds)
        if claim.sweep:  # searched first over the method's recipe; the method arm trains its best point
            sweep, cmds = cmds[0], cmds[1:]
            assert f" sweep {shlex.quote(f'{ROOT}/recipes/{claim.recipe}.yaml')} " in sweep and " --rungs 1,3 " in sweep
            assert all(f"/tmp/w/sweeps/{method}-" in c and shlex.split(c)[4].endswith("/best.yaml") for c in cmds[0::2])
            assert all(f"/{claim.baseline}.yaml" in c for c in cmds[1::2])
            continue
        assert len(cmds) == 4
        assert all(f" {claim.command_of('method')} " in c for c in cmds[0::2])
        assert all(f" {claim.command_of('baseline')} " in c for c in cmds[1::2])
        assert [f"/{claim.recipe}.yaml" in c for c in cmds] == [True, False, True, False]
        assert all(f"/{claim.baseline}.yaml" in c for c in cmds[1::2])
        assert all(all(o in c or shlex.quote(o) in c for o in claim.overrides) for c in cmds)
        scaled = [o.format(steps=3, half=1) for o in claim.scaled]  # the method arm's schedule, scaled to 3 steps
        assert all(all(o in c for o in scaled) for c in cmds[0::2])
        assert not any(o.split("=")[0] in c for o in scaled for c in cmds[1::2])
    assert rp.METHODS["arkd"].command == "distill" and rp.METHODS["drpo"].baseline == "dppo"
    assert "algo.replay.options.replay_from={half}" in rp.METHODS["rerule"].scaled
    assert rp.METHODS["randopt"].command_of("method") == "randopt"
    assert rp.METHODS["randopt"].command_of("baseline") == "train" and rp.METHODS["corp"].command_of("baseline") == "randopt"
    assert "rollout.top_p=0.9" in rp.METHODS["dcmdp"].overrides and rp.METHODS["dcmdp"].also == (
        ("mean:mismatch", "lower"),)


def test_no_seed_is_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        rp.main(["cero", "--seeds", "0"])
    assert exc.value.code == 2 and "--seeds: expected 1 or more" in capsys.readouterr().err


def test_one_seed_runs_and_records_its_arms_and_makes_no_row(tmp_path, monkeypatch, capsys):
    """--first-seed K --seeds 1, a part of a row split over processes: both arms of seed K run (a real
    subprocess each, standing in for `upslope train`) and go to the ledger; the rows file is untouched."""
    launches = tmp_path / "launches"

    def arm_command(recipe, seed, steps, run_dir, overrides, command="train"):
        code = (f"import json, pathlib, sys; open({str(launches)!r}, 'a').write('x'); "
                "p = pathlib.Path(sys.argv[-1]); p.mkdir(parents=True, exist_ok=True); "
                f"(p / 'metrics.jsonl').write_text(json.dumps({{'step': 2, 'eval/accuracy': {0.25 + seed / 10}}}) + '\\n')")
        return [sys.executable, "-c", code, recipe, str(run_dir)]

    monkeypatch.setattr(rp, "arm_command", arm_command)
    rows, ledger = tmp_path / "rows.json", tmp_path / "arms.json"
    assert rp.main(["cero", "--seeds", "1", "--first-seed", "3", "--work", str(tmp_path / "w"), "--rows", str(rows),
                    "--arms", str(ledger)]) == 0
    assert launches.read_text() == "xx" and not rows.exists()
    assert [r["metrics"] for r in json.loads(ledger.read_text())] == [{"eval/accuracy": 0.55}] * 2
    assert "seed 3 recorded for the row's own run; one seed makes no row" in capsys.readouterr().out
    # seed 4 likewise, then the row over seeds 3-4 runs nothing and counts its method arms' CPU from the ledger
    assert rp.main(["cero", "--seeds", "1", "--first-seed", "4", "--work", str(tmp_path / "w"), "--rows", str(rows),
                    "--arms", str(ledger)]) == 0
    arms = json.loads(ledger.read_text())
    for rec, cpu_s in zip(arms, (100.0, 1000.0, 200.0, 2000.0)):  # seed 3's method and baseline, then seed 4's
        rec["cpu_s"] = cpu_s
    ledger.write_text(json.dumps(arms))
    assert rp.main(["cero", "--seeds", "2", "--first-seed", "3", "--work", str(tmp_path / "w"),
                    "--rows", str(rows), "--arms", str(ledger)]) == 0
    (row,) = json.loads(rows.read_text())
    assert launches.read_text() == "xxxx" and row["reused_runs"] == 4
    assert abs(row["cpu_s"] - 300.0) < 1.0, row["cpu_s"]  # the method arms' (a baseline counts where it ran)


ARM_SIDE_BY_SIDE = """
import json, pathlib, sys, time
marks, seed, arm, run_dir = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], pathlib.Path(sys.argv[4])
(marks / f"started-{seed}-{arm}").touch()
if seed == 0 and arm == "method":
    sys.exit("the method arm of seed 0 failed")
deadline = time.monotonic() + 5  # wait for the other arm of this seed to start beside this one
while len(list(marks.glob(f"started-{seed}-*"))) < 2 and time.monotonic() < deadline:
    time.sleep(0.02)
beside = len(list(marks.glob(f"started-{seed}-*"))) == 2
if arm == "method":  # burns CPU, then ends first
    end = time.process_time() + 0.6
    while time.process_time() < end:
        pass
else:  # sleeps, and ends after the method arm: its CPU time must not include the method arm's
    time.sleep(1.5)
run_dir.mkdir(parents=True, exist_ok=True)
(run_dir / "metrics.jsonl").write_text(json.dumps({"step": 2, "eval/accuracy": seed / 10 + (arm == "method") / 100,
                                                   "beside": float(beside)}) + "\\n")
"""


@pytest.mark.parametrize("failing", [False, True])
def test_jobs_run_arms_side_by_side_each_recording_its_own_cpu(tmp_path, monkeypatch, failing):
    """--jobs 2: the two arms of a seed run at once (each real subprocess sees the other start), the row's values
    keep the seeds' order, and each arm's ledger CPU time is its own (a sleeping arm that ends after a busy one
    records almost none). When an arm fails, the arms not yet started never run and the failure is one line."""
    marks = tmp_path / "marks"
    marks.mkdir()

    def arm_command(recipe, seed, steps, run_dir, overrides, command="train"):
        failing_seed = 0 if failing else -1
        return [sys.executable, "-c", ARM_SIDE_BY_SIDE.replace("seed == 0", f"seed == {failing_seed}"), str(marks),
                str(seed), "method" if recipe == "cero" else "baseline", str(run_dir)]

    monkeypatch.setattr(rp, "arm_command", arm_command)
    rows, ledger = tmp_path / "rows.json", tmp_path / "arms.json"
    args = ["cero", "--seeds", "2", "--jobs", "2", "--work", str(tmp_path / "w"), "--rows", str(rows),
            "--arms", str(ledger), "--steps", "2"]
    if failing:
        with pytest.raises(SystemExit, match="failed: the method arm of seed 0 failed"):
            rp.main(args)
        assert sorted(m.name for m in marks.iterdir()) == ["started-0-baseline", "started-0-method"]
        assert [r["metrics"]["eval/accuracy"] for r in json.loads(ledger.read_text())] == [0.0]  # let finish
        assert not rows.exists()
        return
    assert rp.main(args) == 0
    (row,) = json.loads(rows.read_text())
    assert row["arms"]["method"]["values"] == pytest.approx([0.01, 0.11])
    assert row["arms"]["baseline"]["values"] == [0.0, 0.1]
    arms = json.loads(ledger.read_text())
    assert len(arms) == 4 and len(list(marks.iterdir())) == 4
    for rec in arms:
        method = "method" in rec["args"]
        assert (rec["cpu_s"] >= 0.5) if method else (rec["cpu_s"] < 0.4), rec
    for run_dir in (tmp_path / "w").glob("**/seed*"):
        assert json.loads((run_dir / "metrics.jsonl").read_text())["beside"] == 1.0, run_dir


def tiny_args(method: str, model: str, tmp_path: Path, rows: Path) -> tuple[list[str], list[str]]:
    """(the tiny-model overrides, reproduce.py's arguments): 2 steps x 2 seeds of METHOD on the tiny model."""
    tiny = [f"model.name={model}", "engine.name=hf", "rollout.prompts_per_step=2", "rollout.n=2",
            "rollout.max_new_tokens=4", "eval.limit=4", "train.micro_batch_tokens=512", "train.threads=1",
            "data.options.count=50"]
    return tiny, [method, "--steps", "2", "--seeds", "2", "--work", str(tmp_path / "runs"), "--rows", str(rows),
                  *[f"--set={x}" for x in tiny]]


@pytest.mark.slow
def test_tiny_reproduction_end_to_end(tiny_model_path, tmp_path):
    """2 steps x 2 seeds x 2 arms of real `upslope train` runs on the tiny model, two at a time: a row with four
    measured values, its interval and verdict, each arm's own CPU time in the ledger, and a page rendered from it."""
    rows, doc = tmp_path / "rows.json", tmp_path / "reproductions.md"
    tiny, args = tiny_args("cero", tiny_model_path, tmp_path, rows)
    assert rp.main([*args, "--jobs", "2"]) == 0
    (row,) = json.loads(rows.read_text())
    assert len(row["arms"]["method"]["values"]) == 2 and len(row["arms"]["baseline"]["values"]) == 2
    assert row["verdict"] in ("reproduced", "not reproduced", "inconclusive") and row["cpu_s"] > 0
    for arm, recipe in (("method", "cero"), ("baseline", "headroom")):
        for s in (0, 1):
            run_dir = rp.arm_dir(tmp_path / "runs", "cero", arm, recipe, 2, tiny, s)
            recs = metrics(run_dir)
            assert recs[-1]["eval/accuracy"] == row["arms"][arm]["values"][s]
            assert not (run_dir / "checkpoints").exists()  # deleted once the metric is read
    assert row["reused_runs"] == 0 and row["code"] == rp.git_head() and row["cpu"] == rp.cpu_name()
    arms = json.loads(rows.with_name("rows_arms.json").read_text())
    assert len(arms) == 4 and all(0 < a["cpu_s"] for a in arms)
    assert sum(a["cpu_s"] for a in arms) == pytest.approx(row["cpu_s"], rel=0.05)  # each counted once
    for run_dir in (tmp_path / "runs").glob("**/seed*"):  # the stamp each run was made with
        assert json.loads((run_dir / "reproduce_stamp.json").read_text())["commit"] == row["code"]
    assert rp.main(args) == 0  # the same command again: every finished arm is reused, none runs
    again = json.loads(rows.read_text())[-1]
    method_cpu_s = sum(a["cpu_s"] for a in arms if "recipes/cero.yaml" in " ".join(a["args"]))
    assert again["reused_runs"] == 4 and again["arms"] == row["arms"]
    assert 0 <= again["cpu_s"] - method_cpu_s < 5  # the method arms' recorded CPU, nothing run again
    assert rp.main(["--render", "--rows", str(rows), "--doc", str(doc)]) == 0
    assert "| cero |" in doc.read_text()


@pytest.mark.slow
def test_tiny_distillation_reproduction_end_to_end(tiny_model_path, tmp_path):
    """The arkd claim on the tiny model, 2 steps x 2 seeds: a headroom teacher trained first (its
    checkpoint kept), then `upslope distill` arms taught by it; a second call reuses all five runs."""
    rows = tmp_path / "rows.json"
    _, args = tiny_args("arkd", tiny_model_path, tmp_path, rows)
    assert rp.main(args) == 0
    (row,) = json.loads(rows.read_text())
    teacher = Path(row["teacher"]["run_dir"])
    assert (teacher / "checkpoints").is_dir() and 0 <= row["teacher"]["eval/accuracy"] <= 1
    assert len(row["arms"]["method"]["values"]) == 2 and row["reused_runs"] == 0
    method_run = rp.arm_dir(tmp_path / "runs", "arkd", "method", "arkd", 2, [], 0)
    recs = metrics(method_run)
    assert any("distill/arkd_fkl_weight" in r for r in recs)  # the distill command ran the arkd loss
    assert rp.main(args) == 0
    assert json.loads(rows.read_text())[-1]["reused_runs"] == 5


@pytest.mark.slow
def test_tiny_search_reproduction_end_to_end(tiny_model_path, tmp_path):
    """The jf_hpo claim on the tiny model, 2 steps x 2 seeds: `upslope sweep` over six learning rates with
    early stopping at step 1, then the best point's recipe against the baseline; a second call reuses all."""
    rows = tmp_path / "rows.json"
    _, args = tiny_args("jf_hpo", tiny_model_path, tmp_path, rows)
    assert rp.main(args) == 0
    (row,) = json.loads(rows.read_text())
    sweep = row["sweep"]
    assert sweep["trials"] == 6 and set(sweep["point"]) == {"optim.lr"}
    assert sweep["steps_trained"] == 6 * 1 + 2 * 1 < sweep["steps_without_early_stopping"] == 12
    assert Path(sweep["recipe"]).name.startswith("best-") and "optim:" in Path(sweep["recipe"]).read_text()
    method_run = tmp_path / "runs" / "jf_hpo" / "method" / "seed0"
    assert json.loads((method_run / "reproduce_stamp.json").read_text())["args"][3] == sweep["recipe"]
    assert rp.main(args) == 0
    assert json.loads(rows.read_text())[-1]["reused_runs"] == 5  # the sweep and the four runs


def test_committed_page_is_the_generated_one():
    """docs/reproductions.md is generated: regenerate with `python benchmarks/reproduce.py --render`."""
    notes = rp.NOTES.read_text() if rp.NOTES.exists() else ""
    assert rp.DOC.read_text() == rp.render(rp.load_rows(rp.ROWS), notes, plot=True)
    assert (rp.DOC.parent / rp.PLOT).is_file()


def test_the_forest_plot_draws_each_latest_row(tmp_path):
    """plot_rows: a panel per claimed metric, each latest row's difference and interval (accuracy in points),
    written as a PNG; the page links it when asked."""
    pytest.importorskip("matplotlib")
    claim = rp.Claim("cero", "headroom", "eval/accuracy", "higher", "CERO")
    row = rp.row_for("cero", claim, {"eval/accuracy": {"method": [0.5, 0.52, 0.54], "baseline": [0.3, 0.32, 0.34]}},
                     steps=10, seeds=[0, 1, 2], command="c", cpu_s=1.0)
    stale = {**row, "diff": 0.9}
    ece = {**row, "method": "calibration", "metric": "eval/ece", "direction": "lower", "diff": -0.04,
           "ci95": [-0.25, 0.17], "verdict": "inconclusive"}
    out = tmp_path / "results" / "plot.png"
    drawn = rp.plot_rows([stale, row, ece], out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lo, hi = row["ci95"]
    assert drawn == {"eval/accuracy": [("cero (10 x 3)", pytest.approx(20.0), pytest.approx(lo * 100),
                                        pytest.approx(hi * 100))],
                     "eval/ece": [("calibration (10 x 3)", -0.04, -0.25, 0.17)]}
    assert f"]({rp.PLOT})" in rp.render([row], plot=True) and rp.PLOT not in rp.render([row])
    corp = {**row, "method": "corp", "baseline": "randopt"}  # against another method: named in the label
    assert rp.plot_rows([corp], out)["eval/accuracy"][0][0] == "corp vs randopt (10 x 3)"


def test_a_row_split_over_processes_runs_the_later_seeds_into_the_same_directories(capsys, tmp_path):
    """--first-seed 3 --seeds 2 runs seeds 3 and 4 where the whole row's run (--seeds 5) looks for them."""
    rp.main(["codapo", "--dry-run", "--seeds", "2", "--first-seed", "3", "--work", str(tmp_path)])
    part = capsys.readouterr().out.strip().splitlines()
    rp.main(["codapo", "--dry-run", "--seeds", "5", "--work", str(tmp_path)])
    whole = capsys.readouterr().out.strip().splitlines()
    assert part == whole[6:] and "train.seed=3 engine.seed=3" in part[0]
