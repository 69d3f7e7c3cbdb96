"""The `openai_agent` rollout: an agent program, written against the OpenAI client, trains unmodified.

For the length of a rollout an OpenAI-compatible server runs over the policy's engine; each of the
`rollout.n` trajectories per prompt is one run of the program with its own base URL and task row, many
at once. Every call is recorded token-exact (`upslope.agents.recorder`); a trajectory becomes one
training row, or several when the program rewrote its context, all in the prompt's group with the
trajectory's reward. The program's returned reward reaches the `env` reward as its parts; a program
that returns None is scored by the run's reward functions on its last reply."""
from __future__ import annotations

import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, Sequence

from upslope.agents.chat_render import ChatRenderer
from upslope.agents.engine_queue import GenerationQueue
from upslope.agents.program import CommandProgram, FunctionProgram, ProgramFailed, Reward, task_row
from upslope.agents.recorder import Recorder, Row
from upslope.agents.server import PolicyServer, Session
from upslope.batch import Batch, build_batch
from upslope.bounds import NonNegative, Positive, PositiveCount
from upslope.data.types import Example
from upslope.engine import Engine, SamplingParams
from upslope.errors import ConfigError, UpslopeError
from upslope.registry import ROLLOUTS, TOOL_FORMATS

if TYPE_CHECKING:
    from upslope.config import Config


@dataclass
class Outcome:
    """One trajectory after its program returned: its rows, its reward and what went wrong."""

    example: Example
    group: int
    recorder: Recorder
    session: Session
    reward: Reward = None
    ended_by_limit: bool = False  # the program stopped on a limit error (its reward parts count 0)
    error: str = ""
    parts: dict[str, float] = field(default_factory=dict)


class AgentProgramRollout:
    """The rollout of one run: the program, the chat renderer and tool format, the limits."""

    def __init__(self, cfg: Config, tokenizer: Any, *, agent: str = "", command: str = "", concurrency: int = 64,
                 template_rewrites: Literal["keep", "follow"] = "keep", timeout_s: float = 600.0,
                 gather_ms: float = 20.0):
        from upslope.rewards.user import load_user_function

        if bool(agent) == bool(command):
            raise ConfigError("rollout.kind=openai_agent: give the agent program as rollout.options.agent "
                              "('module:function' or 'file.py:function') or rollout.options.command, one of them")
        self.program = (FunctionProgram(load_user_function(agent, "rollout.options.agent"), agent) if agent
                        else CommandProgram(command, timeout_s))
        self.tokenizer = tokenizer
        self.tool_format = TOOL_FORMATS.bind(cfg.agent.tool_format, where="agent.tool_format")()
        self.renderer = ChatRenderer(tokenizer, self.tool_format.instructions)
        self.max_calls, self.max_turn_tokens = cfg.agent.max_turns, cfg.agent.max_turn_tokens
        self.max_prompt_tokens = cfg.rollout.max_prompt_tokens
        self.concurrency, self.template_rewrites = concurrency, template_rewrites
        self.gather_s = gather_ms / 1000
        self.model_name = str(cfg.model.name)
        self.warned = False

    def __call__(self, engine: Engine, prompt_ids: Sequence[list[int]], examples: Sequence[Example],
                 params: SamplingParams, pad_id: int, group_offset: int = 0) -> Batch:
        stop_ids = list(params.stop_token_ids or [self.tokenizer.eos_token_id])
        per_call = replace(params, n=1, stop_token_ids=stop_ids)
        queue = GenerationQueue(engine, seed=params.seed, gather_s=self.gather_s,
                                max_batch=max(1, min(self.concurrency, len(examples) * params.n)))
        try:
            with PolicyServer(queue, self.renderer, self.tool_format, model_name=self.model_name) as server:
                outcomes, o = self._run_all(server, queue, examples, params.n, per_call, group_offset)
        finally:
            queue.close()
        if o is not None:
            raise UpslopeError(f"the agent failed on example {o.example.id or '?'}: {o.error}")
        self._fill_parts(outcomes)
        self._note_rewrites(outcomes)
        rows = [(o, row) for o in outcomes for row in o.recorder.rows]
        return build_batch([r.prompt for _, r in rows], [r.ids for _, r in rows], [r.logprobs for _, r in rows],
                           [o.group for o, _ in rows], [r.truncated for _, r in rows], pad_id, engine.version,
                           [self._meta(o, r, params.max_new_tokens) for o, r in rows],
                           completion_loss_masks=[r.mask for _, r in rows])

    def _run_all(self, server: PolicyServer, queue: GenerationQueue, examples: Sequence[Example], n: int,
                 params: SamplingParams, group_offset: int) -> tuple[list[Outcome], Outcome | None]:
        """Every trajectory's program run, `concurrency` at a time, and the first to fail: after it the others'
        sessions close, so their programs stop at their next call."""
        outcomes = []
        for g, ex in enumerate(examples):
            for _ in range(n):
                rec = Recorder(self.renderer, max_calls=self.max_calls, max_tokens=params.max_new_tokens,
                               max_turn_tokens=self.max_turn_tokens, max_prompt_tokens=self.max_prompt_tokens,
                               on_rewrite=self.template_rewrites)
                outcomes.append(Outcome(ex, group_offset + g, rec, server.open(rec, params)))
        lock = threading.Lock()
        first: list[Outcome] = []  # the first trajectory to fail (the others are then stopped)

        def fail(o: Outcome, error: str) -> None:
            with lock:
                o.error = error if not first else f"stopped after another trajectory failed ({error})"
                if first:
                    return
                first.append(o)
            for other in outcomes:  # their programs stop at their next call
                server.close_session(other.session)

        def run(o: Outcome) -> None:
            if first:
                o.error = "not run: another trajectory failed first"
                return
            queue.open_caller()
            try:
                o.reward = self.program(o.session.base_url, task_row(o.example))
            except ProgramFailed as exc:
                if o.recorder.counts.limit_errors and o.recorder.rows:  # it stopped on a limit: the trajectory ends there
                    o.ended_by_limit = True
                else:
                    fail(o, str(exc) + (f" (the server {o.session.errors[0]})" if o.session.errors else ""))
            finally:
                queue.close_caller()
                server.close_session(o.session)
            if not o.error and not o.recorder.rows:
                fail(o, "the agent returned without calling the model")

        with ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="upslope-agent") as pool:
            list(pool.map(run, outcomes))
        return outcomes, (first[0] if first else None)

    @staticmethod
    def _fill_parts(outcomes: list[Outcome]) -> None:
        """Every trajectory gets every reward part any returned (in first-seen order; missing ones count 0),
        so the reward stage sees one set of components; a batch with no returned reward has no parts."""
        names: dict[str, None] = {}
        for o in outcomes:
            names.update(dict.fromkeys(o.reward or {}))
        for o in outcomes:
            o.parts = {k: (o.reward or {}).get(k, 0.0) for k in names}

    def _note_rewrites(self, outcomes: list[Outcome]) -> None:
        """Once a run: the chat template renders the history differently from what the model sampled."""
        hit = next((o for o in outcomes if o.recorder.counts.template_rewrites), None)
        if hit is None or self.warned:
            return
        self.warned = True
        how = ("rows continue token-exact (rollout.options.template_rewrites=keep): the model trains on what it "
               "saw, not on what the template shows it at inference" if self.template_rewrites == "keep" else
               "such calls start new rows from the template's rendering (template_rewrites=follow)")
        warnings.warn(f"the chat template rewrites the conversation's history ({hit.recorder.rewrite_example}); "
                      f"{how}; metric agent/template_rewrites", UserWarning, stacklevel=2)

    def _meta(self, o: Outcome, row: Row, max_new_tokens: int) -> dict[str, Any]:
        counts = o.recorder.counts
        model_tokens = sum(row.mask)
        return {**o.example.meta, "answer": o.example.answer, "example_id": o.example.id, "prompt": o.example.prompt,
                "completion": row.last_reply, "messages": list(row.messages),
                "transcript": self.renderer.decode(row.ids),
                **({"reward_parts": dict(o.parts)} if o.parts else {}),
                "completion_tokens": len(row.ids), "max_new_tokens": max_new_tokens,
                "finish_reason": "length" if row.truncated else "stop",
                "metrics": {"agent/turns": float(row.replies), "agent/calls": float(counts.calls),
                            "agent/rows": float(len(o.recorder.rows)),
                            "agent/template_rewrites": float(counts.template_rewrites),
                            "agent/context_rewrites": float(counts.context_rewrites),
                            "agent/limit_errors": float(counts.limit_errors),
                            "agent/ended_by_limit": float(o.ended_by_limit),
                            "agent/model_tokens": float(model_tokens),
                            "agent/env_tokens": float(len(row.ids) - model_tokens)}}


def build_openai_agent(cfg: Config, tokenizer: Any, evaluation: bool = False) -> AgentProgramRollout:
    """The openai_agent rollout bound to this run's program, agent section and tokenizer (evaluation runs the
    same program: it has no training-time help to drop)."""
    options = ROLLOUTS.bind(cfg.rollout.kind, cfg.rollout.options, "rollout.options").keywords
    return AgentProgramRollout(cfg, tokenizer, **options)


@ROLLOUTS.register("openai_agent", setup=build_openai_agent)
def openai_agent(engine: Engine, prompt_ids: Sequence[list[int]], examples: Sequence[Example], params: SamplingParams,
                 pad_id: int, group_offset: int = 0, *, agent: str = "", command: str = "",
                 concurrency: PositiveCount = 64, template_rewrites: Literal["keep", "follow"] = "keep",
                 timeout_s: Positive = 600.0, gather_ms: NonNegative = 20.0) -> Batch:
    """An agent program (OpenAI client) against an OpenAI-compatible endpoint over the policy; calls recorded token-exact.

    agent: the program as a Python function 'module:function' or 'file.py:function', called (base_url, row) and returning its reward (a number, a dict of parts, or None)
    command: the program as a shell command instead (base URL in OPENAI_BASE_URL, row as JSON on stdin, reward as JSON on its last output line)
    concurrency: most program runs at once (trajectories of the round beyond it wait)
    template_rewrites: when the chat template renders the history differently from the sampled ids: keep (continue token-exact) or follow (a new row from the template's text)
    timeout_s: wall-clock limit of one run of a command program
    gather_ms: how long the engine waits for more calls before generating (cut short when every running program is waiting)
    """
    raise UpslopeError("rollout.kind=openai_agent needs the run's config: get it with "
                       "upslope.rollout.plugin.make_rollout(cfg, tokenizer)")

