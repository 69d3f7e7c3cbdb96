"""A checkpoint's optimiser moments resume in whatever layout the resuming run's optimiser keeps them
(8-bit blocks, bf16, fp32; upslope's AdamW or torch's fused AdamW): the devices' defaults differ, so a
CPU run (bf16 weights, 8-bit moments) resumed on a GPU (fp32 master weights, torch's AdamW) must carry
its moments over instead of failing on their shapes."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from run_helpers import metrics

from upslope.cli import main
from upslope.train.learner.adamw import AdamW, dequantize_log8
from upslope.train.learner.optim import moments_as

TOY = Path(__file__).resolve().parents[2] / "fixtures" / "toy_rewards.py"


def trained(opt_factory, dtype: torch.dtype, seed: int = 0) -> tuple[list[torch.nn.Parameter], torch.optim.Optimizer]:
    gen = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(shape, generator=gen).to(dtype)) for shape in ((300, 7), (5,))]
    opt = opt_factory(params)
    for _ in range(3):
        for p in params:
            p.grad = (torch.randn(p.shape, generator=gen) * 0.1).to(dtype)
        opt.step()
    return params, opt


def moments(opt: torch.optim.Optimizer, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    st = opt.state[p]
    if "exp_avg_scale" in st:
        n = p.numel()
        return (dequantize_log8(st["exp_avg"], st["exp_avg_scale"])[:n].view(p.shape),
                dequantize_log8(st["exp_avg_sq"], st["exp_avg_sq_scale"])[:n].square().view(p.shape))
    return st["exp_avg"].float(), st["exp_avg_sq"].float()


def test_8bit_moments_load_into_torch_adamw_as_their_dequantised_values():
    src_params, src = trained(lambda ps: AdamW(ps, lr=1e-2, state_dtype=torch.int8), torch.bfloat16)
    dst_params = [torch.nn.Parameter(p.detach().float()) for p in src_params]
    dst = torch.optim.AdamW(dst_params, lr=1e-2)
    dst.load_state_dict(moments_as(src.state_dict(), dst))
    for ps, pd in zip(src_params, dst_params):
        m_src, v_src = moments(src, ps)
        m_dst, v_dst = moments(dst, pd)
        assert m_dst.dtype == torch.float32 and m_dst.shape == pd.shape
        assert torch.equal(m_dst, m_src) and torch.equal(v_dst, v_src)
        assert int(dst.state[pd]["step"]) == 3


def test_fp32_moments_load_into_8bit_adamw_within_the_quantisation_error():
    src_params, src = trained(lambda ps: torch.optim.AdamW(ps, lr=1e-2), torch.float32)
    dst_params = [torch.nn.Parameter(p.detach().to(torch.bfloat16)) for p in src_params]
    dst = AdamW(dst_params, lr=1e-2, state_dtype=torch.int8)
    dst.load_state_dict(moments_as(src.state_dict(), dst))
    for ps, pd in zip(src_params, dst_params):
        m_src, v_src = moments(src, ps)
        m_dst, v_dst = moments(dst, pd)
        # the 8-bit codes' documented bounds: <= 6.6% relative on m, 6.5% on sqrt(v)
        big = m_src.abs() > m_src.abs().max() * 1e-5
        assert ((m_dst - m_src).abs()[big] <= 0.07 * m_src.abs()[big]).all()
        assert ((v_dst.sqrt() - v_src.sqrt()).abs() <= 0.07 * v_src.sqrt() + 1e-30).all()
    for p in dst_params:  # and it steps
        p.grad = torch.ones_like(p)
    dst.step()


def test_a_state_in_the_same_layout_is_returned_unchanged():
    _, src = trained(lambda ps: AdamW(ps, lr=1e-2, state_dtype=torch.int8), torch.bfloat16)
    saved = src.state_dict()
    assert moments_as(saved, src)["state"] is not saved["state"]
    for index, st in moments_as(saved, src)["state"].items():
        assert st is saved["state"][index]


@pytest.mark.parametrize("first,second", [(["model.dtype=bfloat16"], ["model.dtype=float32"]),
                                          (["model.dtype=float32"], ["model.dtype=bfloat16"])])
def test_a_run_resumes_with_another_moment_layout(tiny_model_path, tmp_path, first, second):
    """Step 1 with one weight precision (its optimiser layout), step 2 resumed with the other."""
    run = tmp_path / "run"
    common = [f"model.name={tiny_model_path}", "engine.name=hf", f"run_dir={run}", "log.progress=false",
              "log.tensorboard=false", "log.plot=false", "train.eval_before=false", "train.eval_after=false",
              "rollout.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=4", "train.threads=1",
              "train.precision=bfloat16", "train.save_every=1", f"reward=[{{name: '{TOY}:long_text'}}]"]
    assert main(["train", *common, *first, "train.steps=1"]) == 0
    assert main(["train", *common, *second, "train.steps=2", "train.resume=latest"]) == 0
    steps = [r["step"] for r in metrics(run)]
    assert steps == [1, 2]
