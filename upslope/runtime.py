"""What a run shares between stages: the resolved model path, tokenizer, stop tokens and
the rollout engine (started once, lazily)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from upslope.config import Config, eval_generation_length
from upslope.engine import Engine
from upslope.errors import ConfigError
from upslope.models import load_tokenizer, resolve_model, stop_token_ids
from upslope.rewards.context import RewardContext


@dataclass
class Runtime:
    cfg: Config
    model_path: str
    tokenizer: Any
    stop_ids: list[int]
    _engine: Engine | None = field(default=None, repr=False)
    announce: Any = field(default=print, repr=False)

    @classmethod
    def create(cls, cfg: Config, announce: Any = print) -> "Runtime":
        path = resolve_model(cfg.model.name, cfg.model.gguf_file, cfg.model.cache_dir, announce)
        tok = load_tokenizer(path, cfg.model.chat_template, cfg.model.trust_remote_code)
        from upslope.data.prompts import model_context

        fit_budgets(cfg, model_context(tok), announce)
        from upslope.rollout.engines import check_engine_runs

        check_engine_runs(cfg.engine, path)
        check_moe_options(cfg, path)
        return cls(cfg, path, tok, stop_token_ids(tok, path), announce=announce)

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            # when the run really starts (bad input has been reported by then, as the only line)
            announce_hardware(self.cfg, self.announce)
            self._engine = build_engine(self.cfg, self.model_path, self.tokenizer, self.announce)
            if self._engine.device != "cpu":
                self.announce(f"rollout engine: {self._engine.name} on {self._engine.device}")
        return self._engine

    @property
    def engine_version(self) -> int:
        """Weights version of the engine (0 when it has not been started)."""
        return self._engine.version if self._engine is not None else 0

    def reward_context(self, engine: bool = True) -> RewardContext:
        """What the rewards may use of this run: the policy's tokenizer and stop tokens and, with
        `engine`, its rollout engine (started when a reward first asks for it)."""
        return RewardContext(self.tokenizer, (lambda: self.engine) if engine else None, list(self.stop_ids))

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()
            self._engine = None


def moe_options(cfg: Config) -> list[str]:
    """The options set in `cfg` that act on a MoE model's routers: algo.routing_replay, and each
    algo.terms entry whose term reads the routers' load-balancing loss."""
    from upslope.registry import LOSS_TERMS

    found = ["algo.routing_replay"] if cfg.algo.routing_replay else []
    return found + [f"algo.terms[{i}] ({t.name})" for i, t in enumerate(cfg.algo.terms)
                    if getattr(LOSS_TERMS.get(t.name, "algo.terms").fn, "router_aux_loss", False)]


def check_moe_options(cfg: Config, model_path: str) -> None:
    """Before any work: an option acting on MoE routers (`moe_options`) with a model that has none (or
    routers of a kind `upslope.routing` does not know), or routing replay with an engine that cannot
    return the experts it routed each token to, is one ConfigError line."""
    options = moe_options(cfg)
    if not options:
        return
    from upslope import routing
    from upslope.models import load_model
    from upslope.registry import ENGINES
    from upslope.rollout.engines import engine_name

    reason = routing.why_not_routed(load_model(model_path, trust_remote_code=cfg.model.trust_remote_code, empty=True))
    if reason:
        raise ConfigError(f"{options[0]}: {reason}")
    if not cfg.algo.routing_replay:
        return
    name = engine_name(cfg.engine)
    if not ENGINES.get(name, "engine.name").traits.routed_experts:
        able = sorted(e.name for e in ENGINES.entries() if e.traits.routed_experts)
        picked = f"engine.name=auto picks {name}, which" if cfg.engine.name == "auto" else f"engine.name={name}"
        raise ConfigError(f"algo.routing_replay: {picked} does not return the experts it routed each token to "
                          f"(docs/models.md); set engine.name to one that does: {', '.join(able)}")


def build_engine(cfg: Config, model_path: str, tokenizer: Any, announce: Any = print) -> Engine:
    """The run's rollout engine (engine registry), sized for one rollout batch: the in-process one and
    each Ray rollout worker's are built here alike, on the device a learner would use there."""
    from upslope.hardware import learner_device
    from upslope.rollout.engines import make_engine

    r = cfg.rollout
    max_len = r.max_prompt_tokens + reply_budget(cfg)[1]
    batch_tokens = r.prompts_per_step * r.n * (min(r.max_prompt_tokens, 128) + r.max_new_tokens)
    return make_engine(cfg.engine, model_path, tokenizer, cfg.model.dtype, max_len, kv_tokens=batch_tokens,
                       threads=engine_threads(cfg), device=learner_device(), announce=announce,
                       dtype_chosen="engine.dtype" in cfg.auto_choices(), trust_remote_code=cfg.model.trust_remote_code)


def reply_budget(cfg: Config) -> tuple[str, int]:
    """The longest reply the run's engine must make room for, and the option that sets it: training's
    rollout.max_new_tokens or evaluation's (eval.max_new_tokens, or eval.data's task's length)."""
    train = ("rollout.max_new_tokens", int(cfg.rollout.max_new_tokens or 0))
    ev = eval_generation_length(cfg)
    return ("eval.max_new_tokens", ev) if ev > train[1] else train


def fit_budgets(cfg: Config, context: int | None, announce: Any = print) -> None:
    """Fit the run's token budgets to the model's `context` (None: unknown, nothing to fit) before any
    work: prompt + reply must fit in it. An unset rollout.max_prompt_tokens is lowered to what the
    context leaves beside the longest reply (one note); a combination the user set that cannot fit
    is one ConfigError line naming the options, as is engine.max_model_len over the context."""
    if context is None:
        return
    from upslope.data.prompts import check_reply_within

    r = cfg.rollout
    check_reply_within(context, r.max_new_tokens, "rollout.max_new_tokens")
    reply_option, reply = reply_budget(cfg)
    check_reply_within(context, reply, reply_option)
    if r.max_prompt_tokens + reply > context:
        room = context - reply
        if cfg.prompt_budget_is_default:
            r.max_prompt_tokens = room
            announce(f"rollout.max_prompt_tokens={room}: the model's context of {context} tokens less "
                     f"{reply_option}={reply}")
        else:
            raise ConfigError(f"rollout.max_prompt_tokens={r.max_prompt_tokens} + {reply_option}={reply} = "
                              f"{r.max_prompt_tokens + reply} tokens, over the model's context of {context}; lower "
                              f"rollout.max_prompt_tokens to at most {room} (or leave it unset to fit it), or "
                              f"{reply_option}")
    if cfg.engine.max_model_len is not None and cfg.engine.max_model_len > context:
        raise ConfigError(f"engine.max_model_len={cfg.engine.max_model_len} is over the model's context of "
                          f"{context} tokens; lower it (or leave it unset: prompt + reply budget)")


def engine_threads(cfg: Config) -> int:
    """The engine's fixed thread count, or 0 to fit it to the free cores before each generation.
    Deterministic runs keep one count (every usable core): the thread count changes reduction order."""
    from upslope.hardware import usable_cores

    if cfg.train.threads == 0 and cfg.train.deterministic:
        return usable_cores()
    return cfg.train.threads


def announce_hardware(cfg: Config, announce: Any = print) -> None:
    """Print what `auto` chose for this run and why, and save it as run_dir/hardware.json."""
    import json
    from pathlib import Path

    from upslope import hardware

    d = hardware.machine_defaults()
    applied = cfg.auto_choices()
    if cfg.engine.name == "auto":
        applied["engine.name"] = d.engine_name
    if cfg.train.threads == 0:
        applied["train.threads"] = (f"{hardware.usable_cores()} (deterministic: fixed)" if cfg.train.deterministic
                                    else f"free cores (now {hardware.free_cores()} of {hardware.usable_cores()})")
    announce(hardware.summary(d, applied))
    out = Path(cfg.run_dir) / "hardware.json"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(hardware.record(hardware.machine(), d, applied), indent=1) + "\n")
    except OSError as exc:
        raise ConfigError(f"run_dir={cfg.run_dir}: cannot write {out.name} there ({exc.strerror or exc})") from None
