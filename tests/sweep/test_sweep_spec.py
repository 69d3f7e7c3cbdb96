"""`upslope sweep`'s settings: --space values and ranges, sweep files and flags together, and one
clear error line for every kind of wrong input (before any trial runs)."""
from __future__ import annotations

from pathlib import Path

import pytest

from upslope.cli import main
from upslope.errors import ConfigError
from upslope.sweep.cli import parse
from upslope.sweep.spec import Range, is_sweep_file, parse_dimension, spec_from_args, yaml_value

ROOT = Path(__file__).resolve().parents[2]


def test_space_values_and_ranges_from_the_command_line():
    assert parse_dimension("1e-6,3e-6,abc") == [1e-6, 3e-6, "abc"]  # 1e-6 is a number, unlike in plain YAML 1.1
    assert parse_dimension("[[1], [1, 8]]") == [[1], [1, 8]]
    assert parse_dimension("true,false") == [True, False]
    assert parse_dimension("log_uniform:1e-6:1e-4") == {"log_uniform": ["1e-6", "1e-4"]}
    assert yaml_value(1e-6) == "1.0e-06" and yaml_value([1, 8]) == "[1, 8]" and yaml_value("a b") == "a b"
    r = Range.model_validate({"int_uniform": ["2", "6"]})
    assert (r.kind, r.bounds) == ("int_uniform", (2, 6))


def test_flags_overrides_and_a_sweep_file_combine(tmp_path):
    target, flags, overrides = parse(["recipes/headroom.yaml", "--space", "optim.lr=1e-6,1e-5", "--space=rollout.n=4,8",
                                      "--rungs", "10,20", "--keep-checkpoints", "train.seed=3"])
    assert target == "recipes/headroom.yaml" and overrides == ["train.seed=3"]
    assert flags == {"space": {"optim.lr": [1e-6, 1e-5], "rollout.n": [4, 8]}, "rungs": ["10", "20"],
                     "keep_checkpoints": True}
    spec = spec_from_args(target, flags, overrides)
    assert spec.rungs == [10, 20] and spec.budget == 8 and spec.eta == 3 and spec.keep_checkpoints
    sweep = tmp_path / "sweeps" / "lr.yaml"
    sweep.parent.mkdir()
    sweep.write_text("recipe: ../recipes/headroom.yaml\nspace:\n  optim.lr: {log_uniform: [1.0e-6, 1.0e-4]}\n"
                     "budget: 4\noverrides: {train.seed: 2, eval.k: [1, 8]}\n")
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "headroom.yaml").write_text("train: {steps: 5}\n")
    assert is_sweep_file(str(sweep)) and not is_sweep_file(str(tmp_path / "recipes" / "headroom.yaml"))
    spec = spec_from_args(str(sweep), {"budget": "6", "space": {"rollout.n": [2, 4]}}, ["train.threads=1"])
    assert spec.recipe == str((tmp_path / "recipes" / "headroom.yaml").resolve())  # relative to the sweep file
    assert spec.budget == 6 and list(spec.space) == ["optim.lr", "rollout.n"]  # the flag wins, the space grows
    assert spec.overrides == ["train.seed=2", "eval.k=[1, 8]", "train.threads=1"]
    assert spec.space["optim.lr"].bounds == (1e-6, 1e-4)


@pytest.mark.parametrize("args, expected", [
    (["recipes/headroom.yaml"], "space: empty; give at least one option"),
    (["--space", "optim.lrr=1e-5"], "--space optim.lrr=1.0e-05: config: unknown key 'optim.lrr'; did you mean 'optim.lr'?"),
    (["--space", "optim.lr=1e-5,abc"], "--space optim.lr=abc: config: optim.lr: Input should be a valid number"),
    (["--space", "algo.policy_loss.options.eps_hihg=0.3"], "unknown option for policy_loss 'ppo_clip' (did you mean 'eps_high'?)"),
    (["--space", "data.options.digitz=2"], "data.options.digitz: unknown option for task 'arith' (did you mean 'digits'?)"),
    (["--space", "train.steps=5,10"], "train.steps is set by the sweep for every trial"),
    (["--space", "optim.lr"], "expected KEY=V1,V2"),
    (["--space", "optim.lr=log_uniform:1e-4:1e-6"], "log_uniform: [0.0001, 1e-06] is not a range"),
    (["--space", "optim.lr=1e-5", "--metric", "eval/acuracy"], "did you mean 'eval/accuracy'?"),
    (["--space", "optim.lr=1e-5", "--metric", "eval/pass@8"], "pass@k and maj@k need k in eval.k=[1]"),
    (["--space", "optim.lr=1e-5", "--rungs", "20,10"], "rungs: [20, 10] must be increasing step counts"),
    (["--space", "optim.lr=1e-5", "--eta", "1"], "eta: Input should be greater than or equal to 2"),
    (["--space", "optim.lr=1e-5", "--budjet", "3"], "unknown flag --budjet (did you mean '--budget'?)"),
    (["--space", "optim.lr=1e-5", "--command", "trian"], "'trian' is not a training command (did you mean 'train'?)"),
    (["--space", "optim.lr=1e-5", "train.resume=latest"], "train.resume is set by the sweep"),
    (["--space", "optim.lr=1e-5", "--goal", "best"], "goal: Input should be 'max' or 'min'"),
])
def test_bad_input_is_one_clear_line(args, expected, tmp_path, capsys):
    assert main(["sweep", *args, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("upslope: error: upslope sweep") and expected in err[0], err
    assert not (tmp_path / "out").exists()  # nothing was started


def test_help_lists_every_flag(capsys):
    assert main(["sweep", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: upslope sweep RECIPE|SWEEP.yaml")
    for flag in ("--space", "--budget", "--metric", "--goal", "--rungs", "--eta", "--proxy", "--out", "--executor"):
        assert f"  {flag} " in out, flag


def test_a_recipe_cannot_be_mistaken_for_a_sweep_file():
    assert not any(is_sweep_file(str(p)) for p in (ROOT / "recipes").glob("*.yaml"))
    assert is_sweep_file(str(ROOT / "recipes" / "sweeps" / "headroom_lr.yaml"))
    with pytest.raises(ConfigError, match="unknown setting 'budjet'; did you mean 'budget'"):
        spec_from_args(None, {"budjet": 3, "space": {"optim.lr": [1e-5]}}, [])


def test_in_process_trials_refuse_vllm(tmp_path, capsys):
    pytest.importorskip("vllm")
    args = ["sweep", "--space", "optim.lr=1e-5", "--executor", "inprocess", "engine.name=vllm", "--out", str(tmp_path)]
    assert main(args) == 2
    assert "vllm, which hosts one engine per process; use --executor subprocess" in capsys.readouterr().err
