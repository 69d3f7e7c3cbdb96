"""Bad agent settings are one clear error line (exit 2), before anything is generated."""
from __future__ import annotations

import pytest

from upslope.cli import main


@pytest.mark.parametrize("extra, expected", [
    (["agent.env.name=answr"], "agent.env.name: unknown environment 'answr' (did you mean 'answer'?)"),
    (["agent.tools=[{name: calculater}]"], "agent.tools[0].name: unknown tool 'calculater' (did you mean 'calculator'?)"),
    (["agent.tool_format=hermez"], "agent.tool_format: unknown tool_format 'hermez' (did you mean 'hermes'?)"),
    (["agent.env.options={tool_bonos: 1}"], "agent.env.options.tool_bonos: unknown option for environment 'answer' (did you mean 'tool_bonus'?)"),
    (["agent.tools=[{name: python, options: {timeout_s: soon}}]"], "agent.tools[0].options.timeout_s:"),
    (["agent.max_turns=0"], "agent.max_turns"),
    (["agent.hint_decay=2"], "agent.hint_decay"),
    (["agent.env.options={hints: -1}"], "agent.env.options.hints: Input should be greater than or equal to 0 (got -1)"),
    (["agent.tools=[{name: python, options: {timeout_s: 0}}]"], "agent.tools[0].options.timeout_s: Input should be greater than 0"),
    (["agent.tools=[{name: python, options: {timeout_s: .inf}}]"], "agent.tools[0].options: expected a finite number at timeout_s (got inf)"),
    (["agent.tool_timeout_s=.inf"], "agent.tool_timeout_s: expected a finite number (got inf)"),
    (["rollout.options={branches: 1}"], "rollout.options.branches: unknown option for rollout 'multi_turn'"),
    (["rollout.max_prompt_tokens=64"], "over rollout.max_prompt_tokens=64"),
])
def test_bad_agent_settings_are_one_line(extra, expected, tiny_model_path, tmp_path, capsys):
    args = ["train", f"model.name={tiny_model_path}", "engine.name=hf", f"run_dir={tmp_path / 'r'}", "rollout.kind=multi_turn",
            "agent.tools=[{name: calculator}]", "reward=[{name: env}]", "train.steps=1", "train.eval_before=false",
            "log.progress=false", "rollout.prompts_per_step=2", "rollout.n=2", *extra]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("upslope: error:") and expected in err[0], err
    assert not (tmp_path / "r" / "checkpoints").exists()


def test_a_run_whose_guidance_never_fits_says_so(tiny_model_path, tmp_path, capsys):
    """A budget too small for the environment's reply is not an error, but the run warns once: the hints it
    configured never reach the policy (SocraticPO's first recipe trained as plain GRPO that way)."""
    args = ["train", f"model.name={tiny_model_path}", "engine.name=hf", f"run_dir={tmp_path / 'r'}", "rollout.kind=multi_turn",
            "agent.env.options={hints: 1}", "agent.max_turn_tokens=4", "rollout.max_new_tokens=8", "reward=[{name: env}]",
            "train.steps=2", "train.eval_before=false", "train.eval_every=0", "rollout.prompts_per_step=2", "rollout.n=2"]
    assert main(args) == 0
    out = capsys.readouterr()
    text = " ".join((out.out + out.err).split())  # the console wraps long lines
    assert text.count("did not fit rollout.max_new_tokens=8; raise it (metric agent/env_reply_cut)") == 1, text[-2000:]
