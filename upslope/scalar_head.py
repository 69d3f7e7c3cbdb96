"""A causal-LM body with a one-output linear head: a value per token (PPO's critic) or a score
per sequence (a reward model). It is a Hugging Face sequence-classification model with one
label, so a trained reward model saves and loads as `AutoModelForSequenceClassification`,
and its score here is the one that class computes: the head at the rightmost token that is
not the pad token."""
from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch

from upslope.config import ModelConfig
from upslope.errors import ModelError
from upslope.models import DTYPES


class ScalarHeadModel(torch.nn.Module):
    """`net`: an HF `...ForSequenceClassification` with `num_labels=1` whose head is `net.score`."""

    # its forwards: an FSDP-sharded root gathers its own weights (embeddings, final norm, head) only
    # around a registered forward method (`upslope.distributed.shard.shard_model`)
    forward_methods = ("token_values", "scores_and_states")

    def __init__(self, net: Any):
        super().__init__()
        if not isinstance(getattr(net, "score", None), torch.nn.Linear):
            raise ModelError(f"{type(net).__name__}: a scalar head needs a sequence-classification model whose "
                             f"head is a linear layer named 'score' (Llama, Qwen, Mistral, Gemma, GPT-2 families)")
        self.net = net
        self.config = net.config

    @property
    def body(self) -> Any:
        """The transformer without its head (hidden states out)."""
        return getattr(self.net, self.net.base_model_prefix)

    def token_values(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """[n, L] fp32: the head at every token (the value of the state ending at that token)."""
        hidden = self.body(input_ids=input_ids, attention_mask=attention_mask.long()).last_hidden_state
        return self.net.score(hidden).squeeze(-1).float()

    def sequence_scores(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """[n] fp32: the head at each row's rightmost non-pad token, as HF's class scores it."""
        return self.scores_and_states(input_ids, attention_mask)[0]

    def scores_and_states(self, input_ids: torch.Tensor,
                          attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """([n] fp32 `sequence_scores`, [n, D] fp32 the last hidden state the head reads there), one forward."""
        hidden = self.body(input_ids=input_ids, attention_mask=attention_mask.long()).last_hidden_state
        pos = score_positions(input_ids, attention_mask, self.config.pad_token_id)[:, None]
        scores = self.net.score(hidden).squeeze(-1).float().gather(1, pos).squeeze(1)
        states = hidden.gather(1, pos[..., None].expand(-1, 1, hidden.shape[-1])).squeeze(1).float()
        return scores, states

    def save_pretrained(self, directory: Any, **kwargs: Any) -> None:
        """An HF sequence-classification model directory (what checkpoints and `upslope rm` write)."""
        self.net.save_pretrained(directory, **kwargs)

    @property
    def state_module(self) -> Any:
        """The module whose state dict this one's is (the HF net: its parameter names), for torch's
        distributed state-dict helpers, which look each name up from the module they are given."""
        return self.net

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        return self.net.state_dict(*args, **kwargs)

    def load_state_dict(self, state: Any, strict: bool = True, assign: bool = False) -> Any:  # type: ignore[override]
        return self.net.load_state_dict(state, strict=strict, assign=assign)


def token_values(model: ScalarHeadModel, mb: Any) -> torch.Tensor:
    """[n, L] values of a Batch's rows aligned to tokens: values[:, t] = V(the state that chooses token t),
    0 off the loss mask (PPO's critic)."""
    v = model.token_values(mb.input_ids, mb.attention_mask)
    return torch.cat([torch.zeros_like(v[:, :1]), v[:, :-1]], 1) * mb.loss_mask


def score_positions(input_ids: torch.Tensor, attention_mask: torch.Tensor, pad_id: int | None) -> torch.Tensor:
    """[n] long: each row's rightmost attended token that is not `pad_id` (its last token without a pad id)."""
    keep = attention_mask.bool() if pad_id is None else attention_mask.bool() & (input_ids != pad_id)
    idx = torch.arange(input_ids.shape[1], device=input_ids.device)
    return (idx * keep).argmax(1)


def load_scalar_model(path: str, *, dtype: str = "float32", pad_id: int | None = None, bias: bool = False,
                      trust_remote_code: bool = False, empty: bool = False) -> ScalarHeadModel:
    """A scalar-head model from a causal LM (a fresh head, zero so every score starts at 0) or
    from a saved reward model (its trained head). `bias`: the head has a bias (the critic's).
    `empty`: the architecture only, its parameters on the meta device (see `load_model`)."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from upslope.models import empty_weights

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    trained = any(a.endswith("ForSequenceClassification") for a in (getattr(config, "architectures", None) or []))
    if pad_id is not None:
        config.pad_token_id = pad_id
    config.num_labels = 1
    torch_dtype = DTYPES.get(dtype, torch.float32)
    with empty_weights() if empty else contextlib.nullcontext():
        try:
            if empty:
                net = AutoModelForSequenceClassification.from_config(config, dtype=torch_dtype,
                                                                     trust_remote_code=trust_remote_code)
            else:
                net = AutoModelForSequenceClassification.from_pretrained(path, config=config, dtype=torch_dtype,
                                                                         trust_remote_code=trust_remote_code)
        except ValueError as exc:  # no sequence-classification class for this architecture
            raise ModelError(f"{path}: cannot host a scalar head ({str(exc).splitlines()[0][:200]})") from None
        if not isinstance(getattr(net, "score", None), torch.nn.Linear):
            return ScalarHeadModel(net)  # raises the one-line error
        if not trained or bias:
            hidden = net.score.in_features
            net.score = torch.nn.Linear(hidden, 1, bias=bias, dtype=net.score.weight.dtype)
            torch.nn.init.zeros_(net.score.weight)
            if bias:
                torch.nn.init.zeros_(net.score.bias)
    net.config.use_cache = False
    return ScalarHeadModel(net)


def scalar_loader(*, pad_id: int | None, bias: bool = False,
                  dtype: str | None = None) -> Callable[..., ScalarHeadModel]:
    """An `Updater` model loader that builds a scalar-head model (dtype: the model config's unless given)."""

    def load(path: str, model: ModelConfig, empty: bool = False) -> ScalarHeadModel:
        return load_scalar_model(path, dtype=dtype or model.dtype, pad_id=pad_id, bias=bias,
                                 trust_remote_code=model.trust_remote_code, empty=empty)

    return load


@torch.no_grad()
def score_rows(model: ScalarHeadModel, batch: Any, micro_batch_tokens: int, device: torch.device,
               autocast: Any = None) -> torch.Tensor:
    """[N] fp32 sequence scores of a Batch's rows, no grad, in token-budget micro-batches (eval mode)."""
    return score_and_state_rows(model, batch, micro_batch_tokens, device, autocast)[0]


def score_and_state_rows(model: ScalarHeadModel, batch: Any, micro_batch_tokens: int, device: torch.device,
                         autocast: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """([N] fp32 sequence scores, [N, D] fp32 the hidden states the head read) of a Batch's rows, no grad, in
    token-budget micro-batches (eval mode), on the host."""
    from upslope.batch import micro_batch_indices

    out = torch.zeros(batch.size, dtype=torch.float32)  # cpu: results gathered on the host
    states = torch.zeros(batch.size, int(model.config.hidden_size), dtype=torch.float32)
    was_training = model.training
    model.eval()
    try:
        for idx in micro_batch_indices(batch.seq_lens, micro_batch_tokens):
            mb = batch.select(idx).to(device)
            with autocast if autocast is not None else contextlib.nullcontext():
                scores, hidden = model.scores_and_states(mb.input_ids, mb.attention_mask)
            out[torch.as_tensor(idx)], states[torch.as_tensor(idx)] = scores.cpu(), hidden.cpu()
    finally:
        model.train(was_training)
    return out, states


def tokenizer_difference(a: Any, b: Any) -> str | None:
    """Why two tokenizers would not give the same ids for the same text (None: they agree):
    the vocabulary, or the end/pad tokens."""
    va, vb = a.get_vocab(), b.get_vocab()
    if va != vb:
        diff = next((t for t in sorted(set(va) ^ set(vb))), None)
        if diff is None:
            diff = next(t for t in sorted(va) if va[t] != vb[t])
            return f"token {diff!r} has id {va[diff]} vs {vb[diff]}"
        return f"vocabularies of {len(va)} vs {len(vb)} tokens (e.g. {diff!r} is in only one)"
    for name in ("eos_token_id", "pad_token_id"):
        if getattr(a, name, None) != getattr(b, name, None):
            return f"{name} {getattr(a, name, None)} vs {getattr(b, name, None)}"
    return None
