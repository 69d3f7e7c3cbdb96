"""The `upslope` command line: the trainers (train, sft, rft, dpo, distill, rm, randopt), sweep, eval, config."""
from __future__ import annotations

import os
import sys
from typing import Sequence

from upslope.errors import UpslopeError, one_line

USAGE = """usage: upslope COMMAND [RECIPE.yaml] [key=value ...]

commands:
  train    [RECIPE] [overrides]   train a policy (default: GRPO on one-digit multiplication)
  sft      [RECIPE] [overrides]   supervised fine-tuning (or DFT) on data.path: chats or prompt/response pairs
  rft      [RECIPE] [overrides]   rejection-sampling fine-tuning: sample, keep rewarded replies, fine-tune, repeat
  eval     [RECIPE] [overrides]   evaluate a model: accuracy, pass@k, maj@k, lengths
  distill  [RECIPE] [overrides]   on-policy distillation from distill.teacher (a model, checkpoint, or self)
  dpo      [RECIPE] [overrides]   preference optimisation: DPO / IPO / SimPO on file or on-policy pairs
  rm       [RECIPE] [overrides]   train a reward model (Bradley-Terry) on file or on-policy preference pairs
  randopt  [RECIPE] [overrides]   gradient-free search: Gaussian weight perturbations folded into one model (ES, CoRP)
  sweep    RECIPE|SWEEP.yaml --space KEY=V1,V2 [--space ...] [--budget N] [--metric M] [--rungs S1,S2,...]
                                 hyperparameter search: successive halving over trials of `upslope train`
                                 that resume from their own checkpoints (upslope sweep --help)
  export   CHECKPOINT OUT_DIR [--force]
                                 write a checkpoint as a Hugging Face model (a LoRA adapter merged in);
                                 OUT_DIR must be new or empty (--force: replace it, never a directory
                                 holding the checkpoint or the current directory)
  doctor                         this machine, the engines that work here, and the defaults `auto` picks
  config show [RECIPE] [overrides]  print the resolved config
  config options                 list every option with its default and help
  plugins  [KIND] [--markdown] [plugins=[mod,file.py]]
                                 list registered plugins (all kinds or one) with options and traits

overrides are dotted keys, e.g.  model.name=/path/to/model  eval.n=8  eval.k=[1,8]
"""


HELP = ("-h", "--help", "help")


def _quiet_libraries() -> None:
    """No download/loading progress bars or library warnings on stderr: the CLI's own messages
    (and its one error line) are all a user sees there. The known noise of vLLM and torch is
    filtered where it comes from (upslope.logs.quiet)."""
    from upslope.logs import quiet

    quiet.install()
    quiet.show_each_warning_once()
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover
        pass


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
    if not argv or argv[0] in HELP or (argv[0] != "sweep" and any(a in HELP for a in argv[1:2])):
        print(USAGE)
        return 0
    command, rest = argv[0], argv[1:]
    debug = os.environ.get("UPSLOPE_DEBUG") == "1"
    if not debug:
        _quiet_libraries()
    try:
        return _dispatch(command, rest)
    except UpslopeError as exc:
        if debug:
            raise
        print(f"upslope: error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and closed
        sys.stderr.close()
        return 0
    except OSError as exc:  # the file system refused: full disk, read-only, a file in the path
        if debug or exc.errno is None:
            raise
        print(f"upslope: error: {exc.filename or 'a file'}: {exc.strerror} (files saved before are unchanged)",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("upslope: interrupted", file=sys.stderr)
        return 130


def _plugins_command(rest: list[str]) -> int:
    """`upslope plugins [KIND] [--markdown] [plugins=[...]]`: what the registries hold."""
    from upslope.catalog import plugins_markdown, plugins_text
    from upslope.plugins import import_plugins
    from upslope.yaml_strict import parse_value

    kind, markdown = None, False
    for a in rest:
        if a.startswith("plugins="):
            import_plugins(parse_value(a.partition("=")[2], "plugins") or [])
        elif a == "--markdown":
            markdown = True
        elif "=" in a or a.startswith("-") or kind is not None:
            raise UpslopeError(f"unexpected argument '{a}'; usage: upslope plugins [KIND] [--markdown] "
                               f"[plugins=[my_pkg.module,path/to/file.py]]")
        else:
            kind = a
    if markdown and kind is not None:
        raise UpslopeError("upslope plugins --markdown prints every kind's table (drop the KIND)")
    print(plugins_markdown() if markdown else plugins_text(kind), end="" if markdown else "\n")
    return 0


def _dispatch(command: str, rest: list[str]) -> int:
    from pathlib import Path

    from upslope.config import describe_options, dump, load_config
    from upslope.fsutil import check_run_dir

    if command == "plugins":
        return _plugins_command(rest)
    if command == "sweep":
        from upslope.sweep.cli import sweep_command

        return sweep_command(rest)
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

        cfg = load_config(recipe, overrides)
        check_run_dir(Path(cfg.run_dir), resuming=True)
        return run_eval_command(cfg)
    from upslope.launch import TRAINERS, RankFailed

    if command in TRAINERS:
        from upslope.api import run

        recipe, overrides = _split_args(rest)
        try:
            run(command, recipe, overrides)
        except RankFailed as exc:  # the rank printed its own line (or its traceback)
            return 2 if exc.exit_code == 2 else 1
        return 0
    if command == "export":
        force = "--force" in rest
        paths = [a for a in rest if a != "--force"]
        if len(paths) != 2 or any("=" in a or a.startswith("-") for a in paths):
            raise UpslopeError("usage: upslope export CHECKPOINT_DIR OUT_DIR [--force]")
        from upslope.lora import export

        out, merged = export(Path(paths[0]), Path(paths[1]), force=force)
        print(f"wrote {out} ({'LoRA adapter merged into its base model' if merged else 'full-model checkpoint'}); "
              f"use it as model.name={out}")
        return 0
    raise UpslopeError(f"unknown command '{command}' ({', '.join([*TRAINERS, 'sweep', 'eval', 'export', 'config', 'plugins', 'doctor'])}); "
                       f"see upslope --help")


if __name__ == "__main__":
    sys.exit(main())
