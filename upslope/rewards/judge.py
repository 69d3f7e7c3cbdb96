"""The `llm_judge` reward: a language model grades each completion against a rubric.

The judge is a local model (a path, an HF id, a checkpoint, or `smollm2-135m-instruct`) run
greedily with HF `generate`; `policy`, the run's own rollout engine (vLLM or HF) with its current
weights, so that no second model is loaded; or an OpenAI-compatible chat endpoint (`url`, e.g. a
vLLM server; the key is read from the environment variable `api_key_env`).

Score format: the judge is asked to end its answer with a line `Score: N`, N a number from 0
to `scale`; the reward is N / scale, in [0, 1]. The parser takes the last `Score: N` (also
`score = N`, `N/10`, a bold `**Score:** N`), or a reply that is only a number. A reply with no
such number, or one outside [0, scale], is a failure: the sample gets reward_fallback and is
counted in reward_failures/llm_judge, like any reward that fails. Identical queries are answered
once by each judge, from a bounded cache (the policy judge's, per weights version).
"""
from __future__ import annotations

import json
import math
import os
import re
from collections import OrderedDict
from typing import Any, Sequence

from upslope.bounds import Count, Positive, PositiveCount
from upslope.errors import ConfigError
from upslope.registry import REWARDS
from upslope.rewards.context import RewardContext

DEFAULT_RUBRIC = ("Is the response a correct, complete and clear answer to the request? Give the full scale to a "
                  "correct answer, 0 to a wrong or missing one.")
DEFAULT_TEMPLATE = ("You are grading a response.\n\nRubric: {rubric}\n\nRequest:\n{prompt}\n\nResponse:\n{completion}"
                    "\n{reference}\nGrade the response from 0 to {scale}. End with a line 'Score: N'.")
_NUMBER = r"([-+]?\d+(?:\.\d+)?)"
_SCORE = re.compile(r"score[\s:*=]{0,6}" + _NUMBER, re.IGNORECASE)
_OUT_OF = re.compile(_NUMBER + r"\s*(?:/|out of)\s*" + _NUMBER, re.IGNORECASE)
_ONLY_NUMBER = re.compile(r"\s*" + _NUMBER + r"\s*\.?\s*")
POLICY = "policy"  # options.model naming the run's own rollout engine


def parse_score(text: str, scale: float) -> float | None:
    """The judge's grade as a fraction of `scale` (in [0, 1]), or None when the reply holds no
    usable grade (no number in the documented format, or one outside [0, scale])."""
    hits = _SCORE.findall(text)
    if hits:
        value = float(hits[-1])
    elif (m := list(_OUT_OF.finditer(text))) and float(m[-1].group(2)) > 0:
        value = float(m[-1].group(1)) * scale / float(m[-1].group(2))
    elif (only := _ONLY_NUMBER.fullmatch(text)) is not None:
        value = float(only.group(1))
    else:
        return None
    if not math.isfinite(value) or value < 0 or value > scale:
        return None
    return value / scale


def prompt_text(prompt: Any) -> str:
    """A prompt (text, or chat messages) as plain text for the judge."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        return "\n".join(f"{m.get('role', 'user')}: {m.get('content', '')}" for m in prompt if isinstance(m, dict))
    return "" if prompt is None else str(prompt)


def render_query(tokenizer: Any, query: str, prefill: str) -> str:
    """A judge query as the judge model's text: through its chat template when it has one, then the prefill."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": query}], tokenize=False,
                                             add_generation_prompt=True)
    else:
        text = query + "\n"
    return text + prefill


class Judge:
    """A judge backend: `answer` generates replies; `replies` answers through a bounded cache, so
    that an identical query (for the same weights and prefill) is generated once."""

    def __init__(self) -> None:
        self.cache: "OrderedDict[tuple[Any, ...], str | None]" = OrderedDict()
        self.cached_for: Any = None  # the weights the cached replies are from
        self.generated = 0  # queries answered by the model (not from the cache)

    def weights(self) -> Any:
        """What the replies depend on besides the query (None: fixed weights)."""
        return None

    def answer(self, queries: Sequence[str], prefill: str, max_new_tokens: int | None = None) -> list[str | None]:
        """The model's reply to each query (None: no reply), starting with `prefill`, of at most
        `max_new_tokens` tokens (None: the judge's own limit)."""
        raise NotImplementedError

    def replies(self, queries: Sequence[str], prefill: str, cache_size: int,
                max_new_tokens: int | None = None) -> list[str | None]:
        """The reply to each query, in order: generated once for the distinct new ones, else from
        the cache (emptied when the weights change: older replies are never asked for again).
        `max_new_tokens` bounds these replies (None: the judge's own limit; a rubric needs more
        tokens than a grade)."""
        weights = self.weights()
        if weights != self.cached_for:
            self.cache.clear()
            self.cached_for = weights
        tag = (weights, prefill, max_new_tokens)
        known = {q: self.cache[(tag, q)] for q in queries if (tag, q) in self.cache}
        todo = list(dict.fromkeys(q for q in queries if q not in known))
        if todo:
            known.update(zip(todo, self.answer(todo, prefill, max_new_tokens)))
            self.generated += len(todo)
            for q in todo:
                self.cache[(tag, q)] = known[q]
            while len(self.cache) > cache_size:
                self.cache.popitem(last=False)
        return [known[q] for q in queries]


class LocalJudge(Judge):
    """A local causal LM answering judge queries greedily, in batches (left-padded)."""

    def __init__(self, name: str, device: str, max_new_tokens: int, batch_size: int):
        import torch

        from upslope.models import load_model, load_tokenizer, resolve_model

        super().__init__()
        path = resolve_model(name, option="reward.options.model")
        self.tokenizer = load_tokenizer(path)
        self.device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device)
        self.model = load_model(path).to(self.device).eval()
        self.max_new_tokens, self.batch_size = max_new_tokens, batch_size

    def answer(self, queries: Sequence[str], prefill: str, max_new_tokens: int | None = None) -> list[str | None]:
        import torch

        tok, out = self.tokenizer, []
        for s in range(0, len(queries), self.batch_size):
            texts = [render_query(tok, q, prefill) for q in queries[s:s + self.batch_size]]
            enc = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
            width = max(len(e) for e in enc)
            pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
            ids = torch.tensor([[pad] * (width - len(e)) + e for e in enc], device=self.device)
            mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in enc], device=self.device)
            with torch.no_grad():
                gen = self.model.generate(input_ids=ids, attention_mask=mask,
                                          max_new_tokens=max_new_tokens or self.max_new_tokens,
                                          do_sample=False, pad_token_id=pad)
            out += [prefill + tok.decode(g[width:], skip_special_tokens=True) for g in gen]
        return out


class PolicyJudge(Judge):
    """The run's own rollout engine as the judge: its current weights, greedy, one `generate` call
    per batch of queries; replies are cached per weights version. A query too long for the engine
    (engine.max_model_len) is a failure, counted like a reply with no grade."""

    def __init__(self, context: RewardContext, max_new_tokens: int):
        if context.policy_engine is None or context.policy_tokenizer is None:
            raise ConfigError(f"llm_judge: model={POLICY} judges with the run's own rollout engine, and there is none "
                              f"in this process (with dist.rollout_workers > 0 the policy generates in the Ray "
                              f"workers); name a model to load instead")
        super().__init__()
        self.context, self.max_new_tokens = context, max_new_tokens
        self.calls = 0  # generate calls made

    def weights(self) -> Any:
        engine = self.context.policy_engine()  # type: ignore[misc]
        return id(engine), engine.version

    def answer(self, queries: Sequence[str], prefill: str, max_new_tokens: int | None = None) -> list[str | None]:
        from upslope.engine import SamplingParams

        limit = max_new_tokens or self.max_new_tokens
        engine, tok = self.context.policy_engine(), self.context.policy_tokenizer  # type: ignore[misc]
        ids = [tok(render_query(tok, q, prefill), add_special_tokens=False)["input_ids"] for q in queries]
        room = engine.max_model_len
        fits = [i for i, x in enumerate(ids) if room is None or len(x) + limit <= room]
        out: list[str | None] = [None] * len(queries)
        if fits:
            params = SamplingParams(n=1, temperature=0.0, max_new_tokens=limit,
                                    stop_token_ids=list(self.context.policy_stop_ids))
            for i, [reply] in zip(fits, engine.generate([ids[i] for i in fits], params)):
                out[i] = prefill + reply.text
            self.calls += 1
        return out


class EndpointJudge(Judge):
    """An OpenAI-compatible chat-completions endpoint; a failed request answers None (a failure)."""

    def __init__(self, url: str, model: str, api_key_env: str, max_new_tokens: int, timeout_s: float):
        super().__init__()
        self.url = url.rstrip("/") + ("" if url.rstrip("/").endswith("/chat/completions") else "/chat/completions")
        self.model, self.max_new_tokens, self.timeout_s = model, max_new_tokens, timeout_s
        self.key = os.environ.get(api_key_env, "")

    def answer(self, queries: Sequence[str], prefill: str, max_new_tokens: int | None = None) -> list[str | None]:
        import urllib.request

        out: list[str | None] = []
        for q in queries:
            body = {"model": self.model, "messages": [{"role": "user", "content": q}], "temperature": 0,
                    "max_tokens": max_new_tokens or self.max_new_tokens}
            headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {self.key}"} if self.key
                                                                else {})}
            req = urllib.request.Request(self.url, data=json.dumps(body).encode(), headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    out.append(json.loads(resp.read())["choices"][0]["message"]["content"])
            except Exception:  # network, HTTP or format error: this sample's grade fails (counted)
                out.append(None)
        return out


_JUDGES: dict[tuple[Any, ...], Judge] = {}


def judge_backend(model: str | None, url: str | None, api_model: str, api_key_env: str, device: str,
                  max_new_tokens: int, batch_size: int, timeout_s: float,
                  context: RewardContext | None = None) -> Judge:
    """The judge: a loaded model or an endpoint (kept for the process), or the policy's engine (kept for the run)."""
    if (model is None) == (url is None):
        raise ConfigError("llm_judge: give exactly one of options.model (a local model, or policy: the run's "
                          "own engine) and options.url (an OpenAI-compatible endpoint)")
    if model == POLICY:
        context = context or RewardContext()
        key: tuple[Any, ...] = ("llm_judge", POLICY, max_new_tokens)
        if key not in context.state:
            context.state[key] = PolicyJudge(context, max_new_tokens)
        return context.state[key]
    key = (model, url, api_model, device, max_new_tokens)
    if key not in _JUDGES:
        _JUDGES[key] = (LocalJudge(model, device, max_new_tokens, batch_size) if model is not None
                        else EndpointJudge(str(url), api_model, api_key_env, max_new_tokens, timeout_s))
    return _JUDGES[key]


@REWARDS.register("llm_judge", batched=True, context=True)
def llm_judge_reward(completions: list[str], answers: list[Any], metas: list[dict],
                     context: RewardContext | None = None, *, model: str | None = None,
                     url: str | None = None, api_model: str = "default", api_key_env: str = "OPENAI_API_KEY",
                     rubric: str = DEFAULT_RUBRIC, template: str = DEFAULT_TEMPLATE, scale: Positive = 10.0,
                     prefill: str = "Score:", show_reference: bool = False, max_new_tokens: PositiveCount = 8,
                     batch_size: PositiveCount = 16, device: str = "auto", timeout_s: Positive = 60.0,
                     cache_size: Count = 100_000) -> list[float]:
    """A judge model's grade of each completion against a rubric, as a fraction of `scale`.

    model: local judge: a model path, HF id, checkpoint or smollm2-135m-instruct; policy: the run's own rollout engine (current weights)
    url: OpenAI-compatible endpoint instead (e.g. http://host:8000/v1); tests use local models only
    api_model: the model name sent to the endpoint
    api_key_env: environment variable holding the endpoint's API key (empty or unset: no key sent)
    rubric: what a good response is (inserted into the template)
    template: the query; fields {rubric} {prompt} {completion} {reference} {scale}
    scale: the grade's maximum (the reward is grade / scale)
    prefill: local and policy judges: text the judge's reply starts with (steers it into the score format); part of the parsed text
    show_reference: put the reference answer into the query ({reference})
    max_new_tokens: most tokens the judge writes
    batch_size: local judge: queries per generate call (the policy judge sends a batch in one call)
    device: local judge: auto (the GPU when there is one), cpu, cuda
    timeout_s: endpoint: seconds per request
    cache_size: most judged queries each judge remembers (identical queries are judged once)
    """
    judge = judge_backend(model, url, api_model, api_key_env, device, max_new_tokens, batch_size, timeout_s, context)
    queries = []
    for c, a, m in zip(completions, answers, metas):
        reference = f"\nReference answer: {a}\n" if show_reference and a is not None else ""
        queries.append(template.format(rubric=rubric, prompt=prompt_text(m.get("prompt")), completion=c,
                                       reference=reference, scale=f"{scale:g}"))
    if not queries:
        return []
    replies = judge.replies(queries, prefill if url is None else "", cache_size)
    grades = [parse_score(r, scale) if r is not None else None for r in replies]
    return [math.nan if g is None else g for g in grades]  # NaN: a failure, given reward_fallback and counted
