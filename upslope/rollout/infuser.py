"""INFUSER's two roles in one round (`rollout.kind: infuser`): the policy as generator drafts a question and
its answer from each drawn document, the same policy as solver answers each well-formed question, and each
document's own question with its reference answer is a target row the solver's influence is measured on
(advantage `infuser`, upslope.algos.infuser). Every row of a document keeps the document's group id (one group
per drawn prompt, as the loop counts them); `meta["infuser_role"]` and `meta["infuser_question"]` say which
role and which drafted question a row belongs to."""
from __future__ import annotations

import functools
import inspect
import re
from dataclasses import replace
from typing import Any, Callable, Sequence

import torch

from upslope.batch import Batch
from upslope.data.prompts import encode_prompts
from upslope.data.types import Example
from upslope.errors import UpslopeError
from upslope.bounds import PositiveCount
from upslope.registry import ROLLOUTS
from upslope.engine import Completion, Engine, SamplingParams
from upslope.rollout.plugin import groups_to_batch

GENERATOR_TEMPLATE = ("Read the passage, then write one new question about it whose answer is a number, and that "
                      "number.\nPassage: {document}\nReply exactly as:\nQuestion: <the question>\nAnswer: <the number>")
SOLVER_TEMPLATE = "{document}\n\n{question}"
DRAFT = re.compile(r"Question:[ \t]*(?P<question>[^\n?]*\S[^\n?]*\?).*?(?:Answer:|answer is)\s*\$?"
                   r"(?P<answer>-?\d[\d,]*(?:\.\d+)?)", re.S | re.I)


def parse_draft(text: str) -> tuple[str, str] | None:
    """(question, answer) of a generator's reply: the first 'Question:' with a question on its line (up to its
    '?'), then the first number after a later 'Answer:' or 'answer is' (thousands separators dropped); None when
    the reply has no such pair."""
    m = DRAFT.search(text)
    if m is None:
        return None
    return m.group("question").strip(), m.group("answer").replace(",", "").rstrip(".")


def document_of(example: Example) -> str:
    """The text a generator reads: the example's prompt (its last user message for a chat)."""
    if isinstance(example.prompt, str):
        return example.prompt
    return next((m["content"] for m in reversed(example.prompt) if m.get("role") == "user"), "")


def infuser_round(engine: Engine, prompt_ids: Sequence[list[int]], examples: Sequence[Example],
                  params: SamplingParams, pad_id: int, group_offset: int = 0, *,
                  encode: Callable[[list[Example]], list[list[int]]], answer_ids: Callable[[Any], list[int]],
                  template: str, solver_template: str, solver_n: int, prefill: str) -> Batch:
    """One round of both roles: rollout.n drafts per document, `solver_n` answers per well-formed draft, and the
    document's own question with its reference answer (not trained on: loss mask 0)."""
    docs = [document_of(ex) for ex in examples]
    draft_ids = encode([Example(template.format(document=d), prefill=prefill) for d in docs])
    drafts = engine.generate(draft_ids, params)
    rows: list[tuple[int, list[int], Example, Completion, dict[str, Any], list[int]]] = []
    asked: list[tuple[int, int, Example]] = []
    for g, (ex, d, comps) in enumerate(zip(examples, docs, drafts)):
        for j, c in enumerate(comps):
            parsed = parse_draft(prefill + c.text)
            key = f"{group_offset + g}.{j}" if parsed else None  # unique across a step's rounds
            rows.append((g, draft_ids[g], ex, c, {"infuser_role": "generator", "infuser_question": key},
                         [1] * len(c.token_ids)))
            if parsed:
                asked.append((g, j, replace(ex, prompt=solver_template.format(document=d, question=parsed[0]),
                                            answer=parsed[1], prefill="")))
    ask_ids = encode([a for _, _, a in asked]) if asked else []
    answers = engine.generate(ask_ids, replace(params, n=solver_n)) if asked else []
    for (g, j, ask), comps, ids in zip(asked, answers, ask_ids):
        rows += [(g, ids, ask, c, {"infuser_role": "solver", "infuser_question": f"{group_offset + g}.{j}"},
                  [1] * len(c.token_ids)) for c in comps]
    for g, ex in enumerate(examples):
        gold = answer_ids(ex.answer)
        rows.append((g, list(prompt_ids[g]), ex, Completion(gold, [0.0] * len(gold), str(ex.answer), "stop"),
                     {"infuser_role": "target", "infuser_question": None}, [0] * len(gold)))
    share = {"infuser/well_formed": len(asked) / max(sum(len(c) for c in drafts), 1)}
    return _as_batch(rows, params, pad_id, engine.version, group_offset, share)


def _as_batch(rows: list, params: SamplingParams, pad_id: int, version: int, offset: int,
              round_metrics: dict[str, float]) -> Batch:
    """The rows (document, prompt ids, example, completion, meta, loss mask) as one Batch in document order,
    each row's group id its document's."""
    rows = sorted(rows, key=lambda r: r[0])  # stable: a document's drafts, its answers, its target
    extra = [{**m, "metrics": round_metrics} for *_, m, _ in rows]  # the same value on every row: its mean
    batch = groups_to_batch([r[1] for r in rows], [r[2] for r in rows], [[r[3]] for r in rows], params, pad_id,
                            version, 0, extra, [r[5] for r in rows])
    return replace(batch, group_ids=torch.tensor([offset + r[0] for r in rows], dtype=torch.long))


def build_infuser(cfg: Any, tokenizer: Any, evaluation: bool = False) -> Callable[..., Batch]:
    """The infuser round bound to this run's tokenizer, chat template and options (defaults: `infuser_rollout`'s)."""
    defaults = {k: p.default for k, p in inspect.signature(infuser_rollout).parameters.items()
                if p.kind is inspect.Parameter.KEYWORD_ONLY}
    options = {**defaults, **cfg.rollout.options}
    encode = functools.partial(_encode, tokenizer=tokenizer, system_prompt=cfg.data.system_prompt,
                               use_chat_template=cfg.model.use_chat_template)
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    answer_ids = lambda answer: tokenizer.encode(str(answer), add_special_tokens=False) + eos  # noqa: E731
    return functools.partial(infuser_round, encode=encode, answer_ids=answer_ids, **options)


def _encode(examples: list[Example], *, tokenizer: Any, system_prompt: str | None, use_chat_template: bool
            ) -> list[list[int]]:
    return encode_prompts(examples, tokenizer, system_prompt=system_prompt, use_chat_template=use_chat_template)[0]


@ROLLOUTS.register("infuser", setup=build_infuser, train_only=True)
def infuser_rollout(engine: Engine, prompt_ids: Sequence[list[int]], examples: Sequence[Example],
                    params: SamplingParams, pad_id: int, group_offset: int = 0, *, template: str = GENERATOR_TEMPLATE,
                    solver_template: str = SOLVER_TEMPLATE, solver_n: PositiveCount = 4, prefill: str = "Question:"
                    ) -> Batch:
    """INFUSER: the policy drafts a question and answer per document (rollout.n drafts), then answers each
    well-formed draft `solver_n` times; each document's own question with its reference answer is a target row.

    template: the generator's prompt, with {document} (the drawn example's prompt)
    solver_template: the solver's prompt, with {document} and {question} (the draft's question)
    solver_n: answers sampled per well-formed draft (its solver group)
    prefill: the text the generator's reply starts with (part of its prompt, not trained on)

    The paper's generator and solver co-evolve as two roles; here they are one policy with two prompts and
    one optimiser (our choice), and the solver sees the passage with the question.
    """
    raise UpslopeError("rollout.kind=infuser needs the run's tokenizer: get it with "
                       "upslope.rollout.plugin.make_rollout(cfg, tokenizer)")
