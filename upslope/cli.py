"""The `upslope` command line: the trainers (train, sft, rft, dpo, distill), eval, config."""
from __future__ import annotations

import os
import sys
from typing import Sequence

from upslope.errors import UpslopeError

USAGE = """upslope COMMAND [RECIPE.yaml] [key=value ...]

commands:
  train    [RECIPE] [overrides]   train a policy (default: GRPO on one-digit multiplication)
  sft      [RECIPE] [overrides]   supervised fine-tuning (or DFT) on data.path: chats or prompt/response pairs
  rft      [RECIPE] [overrides]   rejection-sampling fine-tuning: sample, keep rewarded replies, fine-tune, repeat
  eval     [RECIPE] [overrides]   evaluate a model: accuracy, pass@k, maj@k, lengths
  distill  [RECIPE] [overrides]   on-policy distillation from distill.teacher (a model, checkpoint, or self)
  dpo      [RECIPE] [overrides]   preference optimisation: DPO / IPO / SimPO on file or on-policy pairs
  export   CHECKPOINT OUT_DIR     write a checkpoint as a Hugging Face model (a LoRA adapter merged in)
  doctor                         this machine, the engines that work here, and the defaults `auto` picks
  config show [RECIPE] [overrides]  print the resolved config
  config options                 list every option with its default and help

overrides are dotted keys, e.g.  model.name=/path/to/model  eval.n=8  eval.k=[1,8]
"""


def _split_args(args: Sequence[str]) -> tuple[str | None, list[str]]:
    recipe, overrides = None, []
    for a in args:
        if "=" in a:
            overrides.append(a)
        elif recipe is None:
            recipe = a
        else:
            raise UpslopeError(f"unexpected argument '{a}' (give one recipe file, then key=value overrides)")
    return recipe, overrides


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    command, rest = argv[0], argv[1:]
    debug = os.environ.get("UPSLOPE_DEBUG") == "1"
    try:
        return _dispatch(command, rest)
    except UpslopeError as exc:
        if debug:
            raise
        print(f"upslope: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and closed
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("upslope: interrupted", file=sys.stderr)
        return 130


def _dispatch(command: str, rest: list[str]) -> int:
    from upslope.config import describe_options, dump, load_config

    if command == "config":
        if not rest or rest[0] not in ("show", "options"):
            raise UpslopeError("usage: upslope config show [RECIPE] [overrides] | upslope config options")
        if rest[0] == "options":
            for key, default, help_text in describe_options():
                print(f"{key} = {default}    # {help_text}")
            return 0
        recipe, overrides = _split_args(rest[1:])
        print(dump(load_config(recipe, overrides)), end="")
        return 0
    if command == "doctor":
        if rest:
            raise UpslopeError("usage: upslope doctor (it takes no arguments)")
        from upslope.doctor import doctor

        return doctor()
    if command == "eval":
        recipe, overrides = _split_args(rest)
        from upslope.eval.cli import run_eval_command

        return run_eval_command(load_config(recipe, overrides))
    from upslope.train.api import TRAINERS, run_trainer

    if command in TRAINERS:
        recipe, overrides = _split_args(rest)
        run_trainer(command, load_config(recipe, overrides))
        return 0
    if command == "export":
        if len(rest) != 2 or any("=" in a for a in rest):
            raise UpslopeError("usage: upslope export CHECKPOINT_DIR OUT_DIR")
        from pathlib import Path

        from upslope.lora import export

        out, merged = export(Path(rest[0]), Path(rest[1]))
        print(f"wrote {out} ({'LoRA adapter merged into its base model' if merged else 'full-model checkpoint'}); "
              f"use it as model.name={out}")
        return 0
    raise UpslopeError(f"unknown command '{command}' ({', '.join([*TRAINERS, 'eval', 'export', 'config', 'doctor'])}); "
                       f"see upslope --help")


if __name__ == "__main__":
    sys.exit(main())
