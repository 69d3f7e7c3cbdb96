"""`upslope distill` end to end on the tiny model (HF engine): two steps from another tiny model
as teacher, a checkpoint as teacher, the teacher forwarded once per rollout batch however many
updates, self-distillation's fixed point and temperature, and one-line errors for bad input."""
from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch
from run_helpers import metrics, trained

from upslope.cli import main
from upslope.config import load_config
from upslope.models import load_tokenizer, make_tiny_model
from upslope.train.trainers.distill import DistillTrainer
from upslope.train.learner.updater import Updater
from upslope.train.methods.teacher import Teacher, resolve_teacher

RECIPES = Path(__file__).resolve().parents[3] / "recipes"


def tiny_overrides(student: str, run_dir: Path, *extra: str) -> list[str]:
    return [f"model.name={student}", "engine.name=hf", f"run_dir={run_dir}", "log.progress=false",
            "log.tensorboard=false", "log.plot=false", "rollout.prompts_per_step=3", "rollout.n=3",
            "rollout.max_new_tokens=6", "train.steps=2", "train.eval_before=false", "train.eval_after=false",
            "train.micro_batch_tokens=512", "train.threads=1", *extra]



def run(cfg_overrides: list[str], recipe: Path | None = None) -> DistillTrainer:
    return trained(DistillTrainer(load_config(recipe, cfg_overrides)))


@pytest.fixture(scope="module")
def teacher_path(smollm_path, tmp_path_factory) -> str:
    """Another tiny model (different random weights, the same real tokenizer)."""
    return make_tiny_model(smollm_path, tmp_path_factory.mktemp("teacher") / "model", seed=1)


@pytest.fixture(scope="module")
def distill_run(tiny_model_path, teacher_path, tmp_path_factory) -> Path:
    """`upslope distill recipes/distill.yaml` for 2 steps, through the command line."""
    run_dir = tmp_path_factory.mktemp("distill-run")
    rc = main(["distill", str(RECIPES / "distill.yaml"), *tiny_overrides(tiny_model_path, run_dir),
               f"distill.teacher={teacher_path}", "distill.loss.name=mix"])
    assert rc == 0
    return run_dir


def test_command_runs_two_steps(distill_run):
    rows = metrics(distill_run)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        for key in ("loss", "grad_norm", "kl", "distill/rkl_topk", "distill/fkl_topk", "distill/topk_rkl",
                    "distill/forward_ce", "accuracy", "reward/mean"):
            assert math.isfinite(r[key]), key
        assert r["kl"] > 0 and r["distill/rkl_topk"] > 0  # two different random models
    assert (distill_run / "checkpoints" / "step_000002" / "model" / "config.json").exists()


def test_student_moves_toward_the_teacher(tiny_model_path, teacher_path, tmp_path):
    """Four steps of top-k reverse KL: the student's KL to the teacher over its top-k falls
    (the test fails if the update does not pull toward the teacher)."""
    run(tiny_overrides(tiny_model_path, tmp_path, f"distill.teacher={teacher_path}", "distill.loss.name=topk_rkl",
                       "train.steps=4", "optim.lr=3e-3", "train.precision=float32"))
    kl = [r["distill/rkl_topk"] for r in metrics(tmp_path)]
    assert kl[-1] < 0.6 * kl[0], kl


def test_teacher_from_a_checkpoint_or_run_directory(distill_run, tiny_model_path):
    step = distill_run / "checkpoints" / "step_000002"
    assert resolve_teacher(str(step), tiny_model_path) == str(step / "model")
    assert resolve_teacher(str(distill_run), tiny_model_path) == str(step / "model")  # its latest
    assert resolve_teacher("self", tiny_model_path) == tiny_model_path


def test_teacher_forwarded_once_per_rollout_batch(distill_run, tiny_model_path, tmp_path):
    """Four updates per batch (2 mini-batches x 2 epochs) and one old-log-prob pass make five
    student forwards per step; the teacher (a checkpoint here) is forwarded once per step."""
    overrides = tiny_overrides(tiny_model_path, tmp_path, f"distill.teacher={distill_run / 'checkpoints'}/step_000002",
                               "train.updates_per_batch=2", "train.epochs_per_batch=2", "train.share_prompt=false",
                               "train.micro_batch_tokens=100000", "distill.loss.name=topk_rkl")
    trainer = DistillTrainer(load_config(RECIPES / "distill.yaml", overrides))
    from upslope.train.learner.logprobs import fast_head_matches

    for model in (trainer.teacher.model, trainer.updater.model):  # the one-time head check, before counting
        assert fast_head_matches(model)
    calls = {"teacher": 0, "student": 0}
    trainer.teacher.model.get_decoder().register_forward_hook(lambda *_: calls.__setitem__("teacher",
                                                                                          calls["teacher"] + 1))
    trainer.updater.model.get_decoder().register_forward_hook(lambda *_: calls.__setitem__("student",
                                                                                          calls["student"] + 1))
    trained(trainer)
    assert calls == {"teacher": 2, "student": 2 * 5}
    assert [r["distill/teacher_forwards"] for r in metrics(tmp_path)] == [1.0, 1.0]


def test_self_distillation_at_temperature_one_is_a_fixed_point(tiny_model_path, tmp_path):
    """teacher: self at temperature 1 is the student itself at step 1: zero KL, zero gradient."""
    run(tiny_overrides(tiny_model_path, tmp_path, "distill.teacher_temperature=1.0", "train.precision=float32",
                       "distill.loss.name=sampled_rkl"), RECIPES / "distill_self.yaml")
    first = metrics(tmp_path)[0]
    assert first["kl"] == 0 and first["grad_norm"] == 0 and first["loss"] == 0
    assert abs(first["distill/rkl_topk"]) < 1e-6


def test_self_teacher_scores_at_its_temperature(tiny_model_path, tokenizer, tmp_path):
    """The self teacher's log-probs are the starting weights' log-softmax(logits / T)."""
    from upslope.batch import build_batch

    overrides = tiny_overrides(tiny_model_path, tmp_path, "distill.teacher_temperature=2.0", "distill.top_k=4")
    cfg = load_config(RECIPES / "distill_self.yaml", overrides)
    teacher = Teacher(cfg.distill, cfg.model, tiny_model_path, tokenizer)
    learner = Updater.from_config(cfg, tiny_model_path, "cpu")
    b = build_batch([[1, 50, 60], [1, 50, 60]], [[70, 80, 90], [71, 2]], [[0.0] * 3, [0.0] * 2], [0, 0],
                    [False, False], pad_id=2)
    b = teacher.score(b, learner)
    with torch.no_grad(), learner.autocast():
        logits = teacher.model(input_ids=b.input_ids, attention_mask=b.attention_mask.long()).logits.float()
    full = torch.log_softmax(logits / 2.0, -1)[:, :-1]
    m = b.loss_mask[:, 1:] > 0
    want = full.gather(-1, b.input_ids[:, 1:, None])[..., 0]
    assert torch.allclose(b.teacher_logprobs[:, 1:][m], want[m], atol=2e-2)  # bf16 autocast, like training
    assert torch.allclose(b.teacher_topk_logprobs[:, 1:][m], full.topk(4, -1).values[m], atol=2e-2)
    assert (b.teacher_logprobs[b.loss_mask == 0] == 0).all()


@pytest.fixture(scope="module")
def other_vocab_teacher(teacher_path, tmp_path_factory) -> str:
    """A teacher whose tokenizer has one added token: a different vocabulary."""
    path = tmp_path_factory.mktemp("other-vocab") / "model"
    shutil.copytree(teacher_path, path)
    tok = load_tokenizer(str(path))
    tok.add_tokens(["<|tool_call|>"])
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def no_tokenizer_teacher(teacher_path, tmp_path_factory) -> str:
    """A model directory whose tokenizer files are missing."""
    path = tmp_path_factory.mktemp("no-tokenizer") / "model"
    shutil.copytree(teacher_path, path, ignore=shutil.ignore_patterns("tokenizer*", "special_tokens_map.json",
                                                                      "chat_template.jinja"))
    return str(path)


@pytest.mark.parametrize("extra, expected", [
    ([], "distill.teacher: no teacher given"),
    (["distill.teacher=/nonexistent/teacher"], "distill.teacher=/nonexistent/teacher: not a model directory"),
    (["distill.teacher=VOCAB"], "distill.teacher=VOCAB: its tokenizer's vocabulary differs from the student's "
                                "(49153 vs 49152 tokens; first difference: '<|tool_call|>' at id 49152)"),
    (["distill.teacher=NOTOK"], "distill.teacher=NOTOK: its tokenizer could not be loaded from NOTOK"),
    (["distill.teacher=self", "distill.loss.name=topk_kl"], "distill.loss.name: unknown distill_loss 'topk_kl' "
                                                            "(did you mean 'topk_rkl'?)"),
    (["distill.teacher=self", "algo.kl_coef=0.1"], "algo.kl_coef=0.1: distill pulls the student toward the teacher"),
    (["distill.teacher=self", "distill.top_k=100000"], "distill.top_k=100000: more than the vocabulary's 49152 tokens"),
    (["distill.teacher=self", "distill.teacher_temperature=0"], "distill.teacher_temperature: Input should be "
                                                                "greater than 0"),
], ids=["missing", "no_such_path", "vocab_mismatch", "no_tokenizer", "unknown_loss", "kl_coef", "top_k", "temperature"])
def test_bad_input_is_one_line(extra, expected, tiny_model_path, other_vocab_teacher, no_tokenizer_teacher, tmp_path,
                              capsys):
    paths = {"VOCAB": other_vocab_teacher, "NOTOK": no_tokenizer_teacher}
    for name, path in paths.items():
        extra = [e.replace(name, path) for e in extra]
        expected = expected.replace(name, path)
    rc = main(["distill", *tiny_overrides(tiny_model_path, tmp_path), *extra])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1, err
    assert expected in err, err
