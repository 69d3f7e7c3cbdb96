"""`upslope sweep TARGET [--flag VALUE ...] [key=value ...]`: the command line of a sweep, its flags
read off the typed settings (SweepSpec), so `--help` and the checks come from one place."""
from __future__ import annotations

from typing import Any

from upslope.errors import ConfigError, did_you_mean
from upslope.sweep.spec import SweepSpec, parse_dimension

LIST_FLAGS = ("rungs",)  # comma-separated on the command line
SWITCHES = ("keep_checkpoints",)  # flags without a value
HIDDEN = ("recipe", "overrides")  # given as TARGET and key=value arguments


def flag_names() -> list[str]:
    return [f"--{name.replace('_', '-')}" for name in SweepSpec.model_fields if name not in HIDDEN]


def usage() -> str:
    lines = ["usage: upslope sweep RECIPE|SWEEP.yaml --space KEY=V1,V2[,...] [--space ...] [flags] [key=value ...]",
             "",
             "Successive halving over trials of an upslope command (one at a time): every trial trains to the",
             "first rung, the best 1/eta go on to the next rung from their own checkpoint, the rest stop.",
             "A sweep file is YAML with these settings as keys (recipe relative to the file); flags win over it.",
             "key=value arguments are overrides for every trial. A killed sweep continues when run again.",
             "", "flags:"]
    for name, field in SweepSpec.model_fields.items():
        if name in HIDDEN:
            continue
        flag = f"--{name.replace('_', '-')}" + ("" if name in SWITCHES else " VALUE")
        default = "" if "default" in (field.description or "") else f" (default: {field.default})"
        lines.append(f"  {flag:<24} {field.description}{default}")
    lines += ["", "example: upslope sweep recipes/headroom.yaml --space optim.lr=1e-6,3e-6,1e-5,3e-5 --budget 4 \\",
              "           --rungs 10,20,40 --eta 2 --metric eval/accuracy --out runs/sweep-lr"]
    return "\n".join(lines)


def parse(argv: list[str]) -> tuple[str | None, dict[str, Any], list[str]]:
    """(TARGET, flags by setting name, key=value overrides); a wrong flag is one ConfigError line."""
    target, flags, overrides = None, {}, []
    space: dict[str, Any] = {}
    known = flag_names()
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--"):
            name, _, inline = arg[2:].partition("=")
            key = name.replace("-", "_")
            if f"--{name}" not in known:
                hint = did_you_mean(f"--{name}", known)
                raise ConfigError(f"upslope sweep: unknown flag --{name}{hint}; see upslope sweep --help")
            if key in SWITCHES:
                flags[key] = True
                i += 1
                continue
            if inline == "" and i + 1 >= len(argv):
                raise ConfigError(f"upslope sweep: --{name} needs a value; see upslope sweep --help")
            value = inline if "=" in arg else argv[i + 1]
            i += 1 if "=" in arg else 2
            if key == "space":
                k, eq, v = value.partition("=")
                if not eq or not k.strip():
                    raise ConfigError(f"upslope sweep --space {value}: expected KEY=V1,V2 (e.g. optim.lr=1e-6,1e-5) "
                                      f"or KEY=log_uniform:LOW:HIGH")
                space[k.strip()] = parse_dimension(v)
            else:
                flags[key] = value.split(",") if key in LIST_FLAGS else value
            continue
        if "=" in arg:
            overrides.append(arg)
        elif target is None:
            target = arg
        else:
            raise ConfigError(f"upslope sweep: unexpected argument '{arg}' (give one recipe or sweep file, then "
                              f"flags and key=value overrides)")
        i += 1
    if space:
        flags["space"] = space
    return target, flags, overrides


def sweep_command(argv: list[str]) -> int:
    """Run `upslope sweep ...`; 0 once the best config is written."""
    if any(a in ("-h", "--help", "help") for a in argv):
        print(usage())
        return 0
    from upslope.sweep.runner import Sweep
    from upslope.sweep.spec import spec_from_args

    target, flags, overrides = parse(argv)
    Sweep(spec_from_args(target, flags, overrides)).run()
    return 0
