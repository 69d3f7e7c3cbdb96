"""The multi-turn rollout (`rollout.kind: multi_turn`): n trajectories per prompt, each one
token sequence that grows turn by turn. The model's tokens are appended as the engine returned
them (with its log-probs, loss_mask 1); the environment's messages are rendered by the chat
template and appended as new ids (loss_mask 0, log-prob 0). Nothing already in a trajectory is
ever re-tokenised, so the ids the model saw are the ids trained on."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from upslope.agents.chat_render import template_takes_tools, with_system_text
from upslope.agents.env import Environment, Message
from upslope.agents.tools import ToolBox
from upslope.batch import Batch, build_batch
from upslope.data.prompts import encode_prompts
from upslope.data.types import Example
from upslope.engine import Engine, SamplingParams
from upslope.errors import UpslopeError
from upslope.registry import ENVIRONMENTS, ROLLOUTS, TOOL_FORMATS, TOOLS

if TYPE_CHECKING:
    from upslope.config import AgentConfig, Config

_PLACEHOLDER = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "assistant-placeholder"}]


@dataclass
class Trajectory:
    """One conversation in progress: its prompt ids, the ids after it, and what the env said."""

    group: int
    example: Example
    env: Environment
    history: list[Message]
    prompt: list[int]
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    parts: dict[str, float] = field(default_factory=dict)
    hints: int = 0
    turns: int = 0
    tool_turns: list[tuple[int, int]] = field(default_factory=list)  # spans of model turns whose calls all ran
    turn_parts: list[tuple[int, int, dict[str, float]]] = field(default_factory=list)  # model turns: span, parts
    done: bool = False
    truncated: bool = False
    last_turn: str = ""
    pending: list[int] | None = None  # the environment's reply, appended once it fits the budget
    pending_hint: bool = False  # that reply is guidance (counted in `hints` once it is in the row)
    reply_cut: bool = False  # ended because an environment reply did not fit rollout.max_new_tokens
    prefill: str = ""  # the text the environment started the current model turn with

    def append(self, ids: Sequence[int], logprobs: Sequence[float] | None, trained: bool) -> None:
        self.ids += list(ids)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)
        self.mask += [int(trained)] * len(ids)


class AgentRun:
    """What a multi-turn rollout needs besides the engine: the tokenizer, the environment factory,
    the tools and format, and the limits (built once per run from the config)."""

    def __init__(self, agent: AgentConfig, tokenizer: Any, *, max_prompt_tokens: int = 512,
                 system_prompt: str | None = None, use_chat_template: bool = True, guidance: bool = True):
        self.cfg = agent
        self.guidance = guidance  # False (evaluation): a wrong answer the environment would guide ends the trajectory
        self.tokenizer = tokenizer
        self.make_env: Callable[[], Environment] = ENVIRONMENTS.bind(agent.env.name, agent.env.options,
                                                                     where="agent.env.options")
        self.tools = [TOOLS.bind(t.name, t.options, where=f"agent.tools[{i}].options")
                      for i, t in enumerate(agent.tools)]
        self.format = TOOL_FORMATS.bind(agent.tool_format, where="agent.tool_format")()
        self.max_prompt_tokens = max_prompt_tokens
        self.system_prompt = system_prompt
        self.use_chat_template = use_chat_template
        self.template_tools = template_takes_tools(tokenizer)

    @classmethod
    def from_config(cls, cfg: Config, tokenizer: Any, guidance: bool = True) -> "AgentRun":
        return cls(cfg.agent, tokenizer, max_prompt_tokens=cfg.rollout.max_prompt_tokens,
                   system_prompt=cfg.data.system_prompt, use_chat_template=cfg.model.use_chat_template,
                   guidance=guidance)

    def start(self, example: Example, group: int) -> Trajectory:
        """A new trajectory: its environment reset on `example`, its tools offered, its prompt encoded."""
        env = self.make_env()
        env.toolbox = ToolBox(self.tools or list(env.tools), self.format, self.cfg.tool_timeout_s,
                              self.cfg.tool_output_chars)
        messages = list(env.reset(example))
        if self.system_prompt and not any(m.get("role") == "system" for m in messages):
            messages = [{"role": "system", "content": self.system_prompt}] + messages
        prompt, messages = self.encode_prompt(messages, env.toolbox, example)
        return Trajectory(group, example, env, messages, prompt)

    def encode_prompt(self, messages: list[Message], toolbox: ToolBox,
                      example: Example) -> tuple[list[int], list[Message]]:
        """The first messages through the chat template, the tools offered with `tools=` when the
        template takes them, else as the format's instructions in the system message: (ids, messages)."""
        tok = self.tokenizer
        if toolbox.tools and self.template_tools and self.use_chat_template:
            text = tok.apply_chat_template(messages, tools=toolbox.schemas(), tokenize=False,
                                           add_generation_prompt=True)
            ids = tok(text, add_special_tokens=False)["input_ids"]
        else:
            if toolbox.tools:
                messages = with_system_text(messages, toolbox.instructions())
            [ids], _ = encode_prompts([replace(example, prompt=messages)], tok, use_chat_template=self.use_chat_template)
        if len(ids) > self.max_prompt_tokens:
            where = example.meta.get("source", f"example {example.id}")
            raise UpslopeError(f"{where}: the agent prompt (tools included) has {len(ids)} tokens, over "
                               f"rollout.max_prompt_tokens={self.max_prompt_tokens}; raise it")
        return list(ids), messages

    def continuation(self, messages: list[Message], stop_id: int | None, prefill: str = "") -> list[int]:
        """Token ids that close the last assistant turn and render `messages` as the chat template does,
        up to the next assistant turn's header. `stop_id`: the end token the model wrote (the template's
        closing then continues after it, or is left out when it does not start with it); None: the turn was
        cut, so the whole closing is added. Rendered after a fixed placeholder conversation, from the end of
        the placeholder reply's content, so only the new messages are tokenised and a template that renders
        the last assistant turn differently from earlier ones (Qwen3's thinking block) still only appends:
        the model's own turns stay the ids it sampled. `prefill` starts the next assistant turn."""
        tok = self.tokenizer
        content = _PLACEHOLDER[-1]["content"]
        alone = tok.apply_chat_template(_PLACEHOLDER, tokenize=False)
        full = tok.apply_chat_template(_PLACEHOLDER + list(messages), tokenize=False, add_generation_prompt=True)
        if content not in full or content not in alone:
            raise UpslopeError("the chat template does not write an assistant message's content as it is; "
                               "multi_turn rollouts need one that does (set model.chat_template)")
        after = tok(full[full.index(content) + len(content):] + prefill, add_special_tokens=False)["input_ids"]
        if stop_id is None:
            return after
        if after and after[0] == stop_id:
            return after[1:]
        closing = tok(alone[alone.rindex(content) + len(content):], add_special_tokens=False)["input_ids"]
        same = next((i for i, (a, b) in enumerate(zip(after, closing)) if a != b), min(len(after), len(closing)))
        return after[same:]  # the model's own end token stands for the template's closing


def _model_turn(run: AgentRun, tr: Trajectory, completion: Any, limit: int, budget: int, stop_ids: set[int]) -> None:
    """Append one model turn (cut to `limit` tokens), then step the environment on it. A turn cut at
    agent.max_turn_tokens is closed by the rollout (the template's end-of-turn, not trained on); one cut
    by the trajectory's `budget` ends the trajectory as truncated."""
    toks, lps = list(completion.token_ids)[:limit], list(completion.logprobs)[:limit]
    start = len(tr.ids)
    tr.append(toks, lps, trained=True)
    tr.turns += 1
    ended = bool(toks) and toks[-1] in stop_ids
    text = run.tokenizer.decode(toks[:-1] if ended else toks, skip_special_tokens=True)
    tr.last_turn = text
    if not ended and len(tr.ids) >= budget:  # out of tokens inside a turn: the trajectory ends unanswered
        tr.done = tr.truncated = True
        tr.turn_parts.append((start, len(tr.ids), {}))
        return
    tr.history.append({"role": "assistant", "content": tr.prefill + text})
    calls_before, valid_before = tr.env.toolbox.calls, tr.env.toolbox.valid  # type: ignore[union-attr]
    try:
        res = tr.env.step(tr.history, text)
    except Exception as exc:
        raise UpslopeError(f"environment '{run.cfg.env.name}' failed in step ({type(exc).__name__}: {exc})") from exc
    box = tr.env.toolbox
    assert box is not None
    calls, valid = box.calls - calls_before, box.valid - valid_before
    if calls and valid == calls:
        tr.tool_turns.append((start, len(tr.ids)))
    decay = run.cfg.hint_decay ** tr.hints
    for k, v in res.reward_parts.items():
        tr.parts[k] = tr.parts.get(k, 0.0) + decay * float(v)
    tr.turn_parts.append((start, start + len(toks), {k: decay * float(v) for k, v in res.reward_parts.items()}))
    if res.hint and not run.guidance:  # unaided: the wrong answer stands
        tr.done = True
        return
    if res.done or tr.turns >= run.cfg.max_turns:
        tr.done = True
        return
    env_ids = run.continuation(res.messages, toks[-1] if ended else None, res.prefill)
    tr.history += res.messages
    tr.prefill = res.prefill
    tr.pending, tr.pending_hint = env_ids, res.hint


def run_trajectories(run: AgentRun, engine: Engine, examples: Sequence[Example], params: SamplingParams,
                     group_offset: int = 0) -> list[Trajectory]:
    """`params.n` trajectories per example, turn by turn: every unfinished trajectory is one prompt of
    each engine call (its whole sequence so far, so the engine's prefix cache can reuse it)."""
    trajs = [run.start(ex, group_offset + g) for g, ex in enumerate(examples) for _ in range(params.n)]
    budget = params.max_new_tokens
    stop_ids = set(params.stop_token_ids or [run.tokenizer.eos_token_id])
    for turn in range(run.cfg.max_turns):
        active = [t for t in trajs if not t.done]
        if not active:
            break
        limits = [min(run.cfg.max_turn_tokens or budget, budget - len(t.ids)) for t in active]
        seed = None if params.seed is None else params.seed + 7919 * turn
        outs = engine.generate([t.prompt + t.ids for t in active],
                               replace(params, n=1, max_new_tokens=max(limits), seed=seed))
        for tr, limit, [comp] in zip(active, limits, outs):
            take_turn(run, tr, comp, limit, budget, stop_ids)
    finish(trajs)
    return trajs


def take_turn(run: AgentRun, tr: Trajectory, completion: Any, limit: int, budget: int, stop_ids: set[int]) -> None:
    """One turn of a trajectory: the model's completion, then the environment's reply appended (untrained),
    or the trajectory cut when the reply and a turn after it no longer fit the token budget."""
    _model_turn(run, tr, completion, limit, budget, stop_ids)
    pending, tr.pending = tr.pending, None
    if pending is None:
        return
    if len(tr.ids) + len(pending) >= budget:  # no room for the result and a reply: cut here
        tr.done = tr.truncated = tr.reply_cut = True
        return
    tr.append(pending, None, trained=False)
    tr.hints += int(tr.pending_hint)


def finish(trajs: Sequence[Trajectory]) -> None:
    """Every trajectory done and its environment closed, with every declared reward part in declared order
    (the first decides accuracy; a missing one counts 0), then any others."""
    for tr in trajs:
        tr.done = True
        tr.env.close()
        tr.parts = {**{name: tr.parts.get(name, 0.0) for name in tr.env.reward_names}, **tr.parts}


def trajectory_meta(run: AgentRun, tr: Trajectory, max_new_tokens: int) -> dict[str, Any]:
    """What rewards, logs and the SFT term read about a trajectory."""
    box = tr.env.toolbox
    assert box is not None
    model_tokens = sum(tr.mask)
    return {**tr.example.meta, "answer": tr.example.answer, "example_id": tr.example.id,
            "completion": tr.last_turn, "transcript": run.tokenizer.decode(tr.ids, skip_special_tokens=False),
            "messages": list(tr.history),
            "reward_parts": dict(tr.parts), "completion_tokens": len(tr.ids), "max_new_tokens": max_new_tokens,
            "turn_spans": [(a, b) for a, b, _ in tr.turn_parts], "turn_parts": [p for _, _, p in tr.turn_parts],
            "finish_reason": "length" if tr.truncated else "stop",
            "metrics": {"agent/turns": float(tr.turns), "agent/tool_calls": float(box.calls),
                        "agent/valid_tool_calls": float(box.valid),
                        "agent/valid_tool_call_rate": float(box.valid > 0),
                        "agent/hints": float(tr.hints), "agent/env_reply_cut": float(tr.reply_cut),
                        "agent/model_tokens": float(model_tokens),
                        "agent/env_tokens": float(len(tr.ids) - model_tokens)}}


def multi_turn(engine: Engine, prompt_ids: Sequence[list[int]], examples: Sequence[Example], params: SamplingParams,
               pad_id: int, group_offset: int = 0, *, run: AgentRun) -> Batch:
    """n multi-turn trajectories per example as a Batch (one group per example); environment tokens have
    loss_mask 0. The prompts come from each environment's reset (the encoded `prompt_ids` are not used)."""
    return trajectories_batch(run, run_trajectories(run, engine, examples, params, group_offset), params, pad_id,
                              engine.version)


def trajectories_batch(run: AgentRun, trajs: Sequence[Trajectory], params: SamplingParams, pad_id: int,
                       version: int) -> Batch:
    """Finished trajectories as a Batch: environment tokens have loss_mask 0, the SFT term as advantage bonus."""
    batch = build_batch([t.prompt for t in trajs], [t.ids for t in trajs], [t.logprobs for t in trajs],
                        [t.group for t in trajs], [t.truncated for t in trajs], pad_id, version,
                        [trajectory_meta(run, t, params.max_new_tokens) for t in trajs],
                        completion_loss_masks=[t.mask for t in trajs])
    return replace(batch, advantage_bonus=sft_bonus(run, trajs, batch.input_ids.shape))


def sft_bonus(run: AgentRun, trajs: Sequence[Trajectory], shape: torch.Size) -> torch.Tensor:
    """[N, L] the interleaved SFT term as an advantage bonus: agent.sft_coef on the model turns whose tool
    calls all ran, in trajectories that succeeded (at ratio 1 the policy-gradient of +w on a token's
    advantage is that of w x its negative log-likelihood); 0 elsewhere."""
    bonus = torch.zeros(shape, dtype=torch.float32)
    coef = run.cfg.sft_coef
    for i, tr in enumerate(trajs):
        success = tr.parts.get(tr.env.reward_names[0], 0.0) >= 0.5 if tr.env.reward_names else False
        if success and coef:
            for start, end in tr.tool_turns:
                bonus[i, len(tr.prompt) + start:len(tr.prompt) + end] += coef
    return bonus


def build_multi_turn(cfg: Config, tokenizer: Any, evaluation: bool = False) -> Callable[..., Batch]:
    """The multi_turn rollout bound to this run's agent section and tokenizer. For `evaluation` the
    environment's guidance after a wrong answer (hints, a teacher's diagnosis) is not given: guidance is
    training-time help, and the held-out score is what the policy answers unaided (tool calls still run)."""
    return functools.partial(multi_turn, run=AgentRun.from_config(cfg, tokenizer, guidance=not evaluation))


@ROLLOUTS.register("multi_turn", setup=build_multi_turn)
def multi_turn_rollout(engine: Engine, prompt_ids: Sequence[list[int]], examples: Sequence[Example],
                       params: SamplingParams, pad_id: int, group_offset: int = 0) -> Batch:
    """Multi-turn trajectories with tools and an environment (options: the agent section); env tokens masked."""
    raise UpslopeError("rollout.kind=multi_turn needs the run's agent section: get it with "
                       "upslope.rollout.plugin.make_rollout(cfg, tokenizer)")
