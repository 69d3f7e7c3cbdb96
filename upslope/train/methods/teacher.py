"""The distillation teacher: found from a model name/path/GGUF, a checkpoint or run directory, or
'self'; checked to share the student's vocabulary; scores each rollout batch once."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from upslope import checkpoint as ckpt
from upslope.batch import Batch
from upslope.config import DistillConfig, ModelConfig
from upslope.errors import ConfigError, ModelError, UpslopeError
from upslope.models import load_tokenizer, resolve_model

if TYPE_CHECKING:
    from upslope.train.learner.updater import Updater

SELF = "self"


def resolve_teacher(spec: str | None, student_path: str, gguf_file: str | None = None,
                    cache_dir: str | None = None, announce: Any = print) -> str:
    """The HF model directory of `distill.teacher`: a checkpoint RUN/checkpoints/step_N (its
    `model/`), a run directory (its latest checkpoint), 'self' (the student's own starting
    weights), or anything `model.name` accepts (name, directory, .gguf)."""
    if not spec:
        raise ConfigError("distill.teacher: no teacher given; set distill.teacher=PATH (a model, a checkpoint "
                          "RUN/checkpoints/step_N or a run directory) or distill.teacher=self")
    if spec == SELF:
        return student_path
    path = Path(spec).expanduser()
    if path.is_dir() and (path / "model" / "config.json").exists():
        return str(path / "model")
    if path.is_dir() and (path / "checkpoints").is_dir():
        try:
            return str(ckpt.find_checkpoint(path, "latest") / "model")
        except UpslopeError:
            raise ConfigError(f"distill.teacher={spec}: a run directory without a complete checkpoint") from None
    try:
        return resolve_model(spec, gguf_file, cache_dir, announce)
    except UpslopeError as exc:
        reason = str(exc).removeprefix(f"model.name={spec}: ")
        raise ConfigError(f"distill.teacher={spec}: {reason}") from None


def check_same_vocab(student_tokenizer: Any, teacher_tokenizer: Any, spec: str) -> None:
    """Distillation compares the two models token by token: their vocabularies must be identical."""
    student, teacher = student_tokenizer.get_vocab(), teacher_tokenizer.get_vocab()
    if student == teacher:
        return
    differing = sorted(set(student.items()) ^ set(teacher.items()), key=lambda kv: (kv[1], kv[0]))
    token, index = differing[0]
    raise ConfigError(f"distill.teacher={spec}: its tokenizer's vocabulary differs from the student's "
                      f"({len(teacher)} vs {len(student)} tokens; first difference: {token!r} at id {index}); "
                      f"the teacher must share the student's tokenizer")


class Teacher:
    """A frozen model that scores the student's samples at its own temperature: each token's
    log-prob and its top-k tokens per position, computed once per rollout batch (no grad,
    token-budget micro-batches) and kept on the batch, so every update of it reads them. Its
    weights are loaded beside the student's (`load`): across learner ranks read by rank 0 and
    sharded like the student."""

    def __init__(self, d: DistillConfig, model: ModelConfig, student_path: str, student_tokenizer: Any,
                 announce: Any = print):
        self.spec = d.teacher or ""
        self.path = resolve_teacher(d.teacher, student_path, d.teacher_gguf_file, model.cache_dir, announce)
        if d.top_k > len(student_tokenizer):
            raise ConfigError(f"distill.top_k={d.top_k}: more than the vocabulary's {len(student_tokenizer)} tokens")
        if d.teacher != SELF:
            try:
                teacher_tokenizer = load_tokenizer(self.path)
            except (OSError, ValueError, ModelError) as exc:
                raise ConfigError(f"distill.teacher={self.spec}: its tokenizer could not be loaded from {self.path} "
                                  f"({str(exc).splitlines()[0]})") from None
            check_same_vocab(student_tokenizer, teacher_tokenizer, self.spec)
        self.model: Any = None  # loaded by `load`, once the student's learner exists
        self.temperature = d.teacher_temperature
        self.top_k = d.top_k
        self.forward_passes = 0  # micro-batch forwards so far

    def load(self, updater: "Updater") -> None:
        """The teacher's weights, frozen and placed like the student's policy (once)."""
        if self.model is None:
            self.model = updater.frozen(self.path)

    def score(self, batch: Batch, updater: "Updater") -> Batch:
        """The batch with teacher_logprobs [N, L] and teacher_topk_ids / _logprobs [N, L, K]."""
        self.load(updater)
        teacher_vocab = self.model.get_output_embeddings().weight.shape[0]
        out = updater.score(batch, self.model, temperature=self.temperature, top_k=self.top_k,
                            top_k_vocab=min(updater.vocab_size, teacher_vocab))  # padded heads may differ in size
        self.forward_passes += len(updater.micro_batches(batch))
        return replace(batch, teacher_logprobs=out.logprobs, teacher_topk_ids=out.topk_ids,
                       teacher_topk_logprobs=out.topk_logprobs)
