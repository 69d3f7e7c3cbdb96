"""User plugin modules (`plugins=[...]`), registries the run consults (samplers, engines), the
names a config gives checked against the registries, and `upslope plugins`.

Every plugin here is a real file or package imported the way a user's is; each test registers
names of its own (registries are process-wide)."""
from __future__ import annotations

import importlib.util
import textwrap
import uuid
from pathlib import Path

import pytest

from upslope.cli import main
from upslope.config import load_config
from upslope.data.samplers import UniformSampler, make_sampler
from upslope.errors import ConfigError
from upslope.registry import ADVANTAGES, ENGINES, SAMPLERS
from upslope.rollout.engines import engine_name, make_engine


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def write(path: Path, code: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(code))
    return path


def advantage_plugin(path: Path, name: str) -> Path:
    return write(path, f'''
        import torch
        from upslope.registry import ADVANTAGES

        @ADVANTAGES.register("{name}", grouped=True)
        def adv(batch, *, scale: float = 1.0, center: bool = True):
            """Scaled reward on every token (a test plugin).

            scale: multiplies the reward
            """
            return batch.loss_mask * scale
        ''')


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ------------------------------------------------------------------ plugins=[...]


def test_a_plugin_file_on_the_command_line_makes_its_name_valid(tmp_path, monkeypatch):
    name = unique("adv")
    advantage_plugin(tmp_path / "mine.py", name)
    with pytest.raises(ConfigError, match=rf"algo.advantage.name: unknown advantage '{name}'; known: .*grpo"):
        load_config(None, [f"algo.advantage.name={name}"])
    monkeypatch.chdir(tmp_path)  # a command-line path is relative to the working directory
    cfg = load_config(None, ["plugins=[mine.py]", f"algo.advantage.name={name}", "algo.advantage.options.scale=2"])
    assert cfg.algo.advantage.name == name and cfg.plugins == [str((tmp_path / "mine.py").resolve())]
    bound = ADVANTAGES.bind(name, cfg.algo.advantage.options)
    assert bound.keywords == {"scale": 2.0}
    assert ADVANTAGES.get(name).shown_traits() == {"grouped": True}


def test_a_recipe_names_plugin_files_relative_to_itself_and_modules_by_name(tmp_path, monkeypatch):
    file_name, module_name = unique("adv"), unique("adv")
    advantage_plugin(tmp_path / "recipes" / "plugins" / "mine.py", file_name)
    pkg = unique("userpkg")
    write(tmp_path / "site" / pkg / "__init__.py", "")
    advantage_plugin(tmp_path / "site" / pkg / "advs.py", module_name)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    recipe = write(tmp_path / "recipes" / "r.yaml", f"""
        plugins: [plugins/mine.py, {pkg}.advs]
        algo:
          advantage: {{name: {file_name}}}
        """)
    monkeypatch.chdir(tmp_path / "site")  # elsewhere: the recipe's path still resolves
    cfg = load_config(recipe, ["algo.policy_loss.name=ppo_clip"])
    assert cfg.algo.advantage.name == file_name
    assert cfg.plugins == [str((tmp_path / "recipes" / "plugins" / "mine.py").resolve()), f"{pkg}.advs"]
    assert load_config(recipe, [f"algo.advantage.name={module_name}"]).algo.advantage.name == module_name
    assert ADVANTAGES.get(module_name).module == f"{pkg}.advs"


@pytest.mark.parametrize("entry, code, expected", [
    ("missing.py", None, r"^upslope: error: plugins: file not found: .*missing\.py$"),
    ("no_such_pkg_xyz.mod", None, r"^upslope: error: plugins: module 'no_such_pkg_xyz.mod' not found"),
    ("broken.py", "x = 1\ndef f(:\n    pass\n", r"^upslope: error: .*broken\.py:2: syntax error in plugin module"),
    ("raises.py", "import os\n\nraise RuntimeError('no GPU here')\n",
     r"^upslope: error: .*raises\.py:3: importing plugin .*raises\.py raised RuntimeError: no GPU here$"),
    ("clash.py", "from upslope.registry import ADVANTAGES\n\n@ADVANTAGES.register('grpo')\ndef g(batch):\n"
                 "    return batch.loss_mask\n",
     r"^upslope: error: .*clash\.py:3: plugin .*advantage 'grpo' is registered twice \(by upslope.algos.advantages"),
    ("[a.py", None, r"^upslope: error: plugins: expected a list"),
])
def test_plugin_errors_are_one_line_with_exit_code_2(entry, code, expected, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    if code is not None:
        write(tmp_path / entry, code)
    value = entry if entry.startswith("[") else f"[{entry}]"
    status, out, err = run_cli(capsys, "config", "show", f"plugins={value}")
    assert status == 2 and out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert __import__("re").search(expected, err.strip()), err


def test_a_config_made_in_python_imports_its_plugins_too(tmp_path):
    from upslope.config import Config

    name = unique("adv")
    path = advantage_plugin(tmp_path / "py.py", name)
    assert name not in ADVANTAGES
    Config(plugins=[str(path)])
    assert name in ADVANTAGES
    with pytest.raises(ConfigError, match=r"^plugins: file not found: "):
        Config(plugins=[str(tmp_path / "nope.py")])


def test_a_plugin_file_is_imported_once_per_process(tmp_path):
    name = unique("adv")
    path = advantage_plugin(tmp_path / "once.py", name)
    first = load_config(None, [f"plugins=[{path}]", f"algo.advantage.name={name}"])
    again = load_config(None, [f"plugins=[{path}]", f"algo.advantage.name={name}"])  # no "registered twice"
    assert first.algo.advantage == again.algo.advantage


# ------------------------------------------------------------------ names checked, samplers, engines


def test_every_plugin_name_in_a_config_is_checked_against_its_registry():
    cases = {"engine.name=vlm": "engine.name: unknown engine 'vlm' (did you mean 'vllm'?); known: auto, ",
             "data.sampler.name=curriculm": "data.sampler.name: unknown sampler 'curriculm'",
             "algo.filters=[{name: nonzero_sd}]": "algo.filters[0].name: unknown filter 'nonzero_sd' (did you mean "
                                                  "'nonzero_std'?)",
             "algo.kl_estimator=k4": "algo.kl_estimator: unknown kl 'k4'",
             "dpo.loss.name=dpo": "dpo.loss.name: unknown preference_loss 'dpo'",
             "reward=[{name: intger}]": "reward[0].name: unknown reward 'intger' (did you mean 'integer'?)"}
    for override, message in cases.items():
        with pytest.raises(ConfigError) as info:
            load_config(None, [override])
        assert str(info.value).startswith(f"config: {message}"), str(info.value)
    assert load_config(None, ["reward=[{name: 'my_pkg.rewards:score'}]"]).reward[0].name == "my_pkg.rewards:score"


def test_the_uniform_sampler_is_the_default_and_data_shuffle_reaches_it():
    cfg = load_config(None, [])
    assert cfg.data.sampler.name == "uniform"
    assert make_sampler(cfg.data, 50, seed=3).next(20) == UniformSampler(50, seed=3, shuffle=True).next(20)
    ordered = load_config(None, ["data.shuffle=false"])
    assert make_sampler(ordered.data, 50, seed=3).next(7) == list(range(7))
    with pytest.raises(ConfigError, match=r"data.sampler.options.shufle: unknown option for sampler 'uniform'"):
        make_sampler(load_config(None, ["data.sampler.options={shufle: false}"]).data, 5, 0)


def test_a_user_sampler_is_chosen_by_data_sampler_with_its_options(tmp_path):
    name = unique("stride")
    path = write(tmp_path / "samplers.py", f'''
        from upslope.registry import SAMPLERS

        @SAMPLERS.register("{name}")
        class Stride:
            """Every k-th prompt, in order.

            step: distance between consecutive prompts
            """
            def __init__(self, num_prompts, seed, shuffle, *, step: int = 2):
                self.n, self.step, self.pos = num_prompts, step, 0

            def next(self, count):
                out = [(self.pos + i * self.step) % self.n for i in range(count)]
                self.pos = (self.pos + count * self.step) % self.n
                return out
        ''')
    cfg = load_config(None, [f"plugins=[{path}]", f"data.sampler={{name: {name}, options: {{step: 3}}}}"])
    sampler = make_sampler(cfg.data, 10, cfg.train.seed)
    assert sampler.next(4) == [0, 3, 6, 9] and sampler.next(2) == [2, 5]
    with pytest.raises(ConfigError, match=r"data.sampler.options.step: Input should be a valid integer"):
        make_sampler(load_config(None, [f"plugins=[{path}]", f"data.sampler={{name: {name}, options: {{step: x}}}}"])
                     .data, 10, 0)
    assert SAMPLERS.get(name).option_help() == {"step": "distance between consecutive prompts"}


def test_auto_takes_the_available_engine_with_the_lowest_rank():
    from upslope.registry import EngineTraits, Entry
    from upslope.rollout.engines import auto_engine
    from upslope.rollout.hf import build_hf

    entries = [Entry("fast", build_hf, "", EngineTraits(auto_rank=0, requires="no_such_engine_module_xyz")),
               Entry("plain", build_hf, "", EngineTraits(auto_rank=2)), Entry("manual", build_hf, "", EngineTraits()),
               Entry("second", build_hf, "", EngineTraits(auto_rank=1, requires="torch"))]
    assert auto_engine(entries) == "second"
    assert auto_engine(entries[1:3]) == "plain"
    with pytest.raises(ConfigError, match=r"^engine.name=auto: no rollout engine is available \(auto picks among "
                                          r"fast\)$"):
        auto_engine(entries[:1] + entries[2:3])


def test_auto_resolves_through_the_registry():
    cfg = load_config(None, ["engine.name=auto"])
    expected = "vllm" if importlib.util.find_spec("vllm") is not None else "hf"
    assert engine_name(cfg.engine) == expected
    assert ENGINES.get("vllm").traits.auto_rank < ENGINES.get("hf").traits.auto_rank


def test_a_user_engine_is_built_by_name_with_its_options(tmp_path, tiny_model_path, tokenizer):
    name, missing = unique("engine"), unique("needs")
    path = write(tmp_path / "engines.py", f'''
        from upslope.registry import ENGINES
        from upslope.rollout.hf import HFEngine

        class CountingHF(HFEngine):
            name = "{name}"

        @ENGINES.register("{name}")
        def build(cfg, ctx, *, batch_size: int = 4):
            """HF generate with its own batch size (a test engine)."""
            return CountingHF(ctx.model_path, ctx.tokenizer, dtype="float32", batch_size=batch_size)

        @ENGINES.register("{missing}", requires="no_such_module_{missing}", install="pip install it")
        def build_missing(cfg, ctx):
            """An engine whose module is not installed."""
            raise AssertionError("never built")
        ''')
    cfg = load_config(None, [f"plugins=[{path}]", f"engine.name={name}", "engine.options={batch_size: 3}"])
    engine = make_engine(cfg.engine, tiny_model_path, tokenizer, "float32", 256)
    try:
        assert type(engine).__name__ == "CountingHF" and engine.name == name and engine.batch_size == 3
    finally:
        engine.close()
    assert engine_name(load_config(None, [f"plugins=[{path}]"]).engine) in ("vllm", "hf")  # never auto-picked
    with pytest.raises(ConfigError, match=rf"^engine.name={missing}: no_such_module_{missing} is not installed "
                                          r"\(pip install it\)$"):
        make_engine(load_config(None, [f"plugins=[{path}]", f"engine.name={missing}"]).engine, tiny_model_path,
                    tokenizer, "float32", 256)


# ------------------------------------------------------------------ upslope plugins


def test_upslope_plugins_lists_every_kind_with_options_help_and_traits(tmp_path, capsys):
    status, out, _ = run_cli(capsys, "plugins")
    assert status == 0
    for kind in ("advantage", "policy_loss", "kl", "reward", "reward_combiner", "filter", "sampler", "engine",
                 "task", "distill_loss", "preference_loss", "rollout"):
        assert f"\n{kind} (" in "\n" + out, kind
    assert "  grpo: GRPO:" in out and "      eps: float (>=0) = 1e-06" in out
    ppo = out[out.index("  ppo_clip:"):]
    assert ppo.splitlines()[1] == "      traits: zero_at_zero_advantage=True"
    assert "      beta: float (>0) = 0.1" in out  # a constrained type, readable
    name = unique("adv")
    path = advantage_plugin(tmp_path / "listed.py", name)
    status, out, _ = run_cli(capsys, "plugins", "advantage", f"plugins=[{path}]")
    assert status == 0 and out.startswith("advantage (") and "\npolicy_loss (" not in out
    mine = out[out.index(f"  {name}:"):].splitlines()
    assert mine[0].startswith(f"  {name}: Scaled reward on every token (a test plugin). [upslope_user_plugins.")
    assert mine[1:4] == ["      traits: grouped=True", "      scale: float = 1.0  # multiplies the reward",
                         "      center: bool = True"]


def test_upslope_plugins_rejects_an_unknown_kind_in_one_line(capsys):
    status, out, err = run_cli(capsys, "plugins", "advantages")
    assert status == 2 and out == ""
    line = err.strip()
    assert line.startswith("upslope: error: upslope plugins: unknown kind 'advantages'; known: accept, advantage, "
                           "consolidate, distill_loss, engine, environment, filter, kl, loss_term, policy_loss, "
                           "preference_loss, replay, reward, reward_combiner, ")
    assert "\n" not in line and ", sampler, task" in line


def test_help_is_the_first_paragraph_and_option_lines_come_after_it():
    from upslope.registry import Entry

    def plugin(batch, *, strict: bool = True, eps: float = 1e-6, other: int = 0):
        """Compare the answer. strict: the extraction alone
        decides (this is prose in the summary, not an option's help).

        strict: only the extracted answer counts
          eps:   tolerance of the comparison
        unknown: a line naming no option is ignored
        """

    entry = Entry("p", plugin, "", {})
    assert entry.summary() == ("Compare the answer. strict: the extraction alone decides (this is prose in the "
                               "summary, not an option's help).")
    assert entry.option_help() == {"strict": "only the extracted answer counts", "eps": "tolerance of the comparison"}


def test_one_file_imported_as_a_module_and_by_path_registers_once(tmp_path, monkeypatch):
    name, pkg = unique("adv"), unique("both")
    path = advantage_plugin(tmp_path / f"{pkg}.py", name)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load_config(None, [f"plugins=[{pkg}, {path}]", f"algo.advantage.name={name}"])
    assert cfg.algo.advantage.name == name and ADVANTAGES.get(name).module == pkg  # the first import's entry


def test_every_option_of_every_built_in_plugin_has_help():
    """docs/plugins.md shows each option's help, read from the docstring's `name: help` lines."""
    from upslope.registry import REGISTRIES, load_builtins

    load_builtins()
    missing, checked = [], 0
    for kind, registry in sorted(REGISTRIES.items()):
        for entry in registry.entries():
            if not (entry.module == "upslope" or entry.module.startswith("upslope.")):
                continue  # a plugin a test or a user registered
            help_ = entry.option_help()
            for option in entry.options():
                checked += 1
                if not help_.get(option):
                    missing.append(f"{kind}/{entry.name}.{option}")
    assert checked > 50
    assert not missing, "built-in options without a `name: help` docstring line: " + ", ".join(missing)
