"""The fused MLP and RMSNorm against the Hugging Face modules they replace."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

from pt_train import fused
from pt_train.fused import RMSNormFunction, SwiGLUMLPFunction, apply_fused_ops


def _grads(module: nn.Module, x: torch.Tensor, grad_out: torch.Tensor):
    x = x.detach().clone().requires_grad_(True)
    y = module(x)
    y.backward(grad_out)
    return y.detach(), x.grad, {n: p.grad.clone() for n, p in module.named_parameters()}


def _compare(reference: nn.Module, x: torch.Tensor, atol: float, rtol: float) -> None:
    lean = copy.deepcopy(reference)
    counts = apply_fused_ops(lean)
    assert sum(counts.values()) == 1
    grad_out = torch.randn(*x.shape[:-1], reference(x).shape[-1], dtype=x.dtype)
    y_ref, gx_ref, gp_ref = _grads(reference, x, grad_out)
    y, gx, gp = _grads(lean, x, grad_out)
    torch.testing.assert_close(y, y_ref, atol=atol, rtol=rtol)
    torch.testing.assert_close(gx, gx_ref, atol=atol, rtol=rtol)
    assert gp.keys() == gp_ref.keys()
    for name in gp:
        torch.testing.assert_close(gp[name], gp_ref[name], atol=atol, rtol=rtol, msg=name)


def _config(**kw) -> LlamaConfig:
    return LlamaConfig(hidden_size=64, intermediate_size=176, rms_norm_eps=1e-6, **kw)


@pytest.mark.parametrize("dtype,atol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_mlp_matches_the_llama_mlp(dtype, atol, monkeypatch):
    # A small chunk size, so the backward runs over several chunks and a ragged last one.
    monkeypatch.setattr(fused, "CHUNK_ELEMENTS", 176 * 8)
    monkeypatch.setattr(fused, "MIN_CHUNK_ROWS", 8)
    torch.manual_seed(0)
    mlp = LlamaMLP(_config()).to(dtype)
    _compare(mlp, torch.randn(3, 13, 64, dtype=dtype), atol=atol, rtol=atol)


def test_rms_norm_matches_the_llama_rms_norm():
    # (in fp32: the Hugging Face module computes in fp32 even for fp64 inputs)
    torch.manual_seed(0)
    norm = LlamaRMSNorm(64, eps=1e-6)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)  # not all ones, so the weight's gradient matters
    _compare(norm, 3.0 * torch.randn(2, 7, 64), atol=1e-5, rtol=1e-5)


def test_rms_norm_keeps_bf16_in_and_out():
    norm = LlamaRMSNorm(32).to(torch.bfloat16)
    apply_fused_ops(norm)
    x = torch.randn(4, 32, dtype=torch.bfloat16, requires_grad=True)
    y = norm(x)
    y.sum().backward()
    assert y.dtype == x.grad.dtype == norm.weight.grad.dtype == torch.bfloat16
    reference = LlamaRMSNorm(32).to(torch.bfloat16)(x.detach())
    torch.testing.assert_close(y, reference)


def test_gradcheck_in_double():
    torch.manual_seed(0)
    x = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)
    wg, wu = (torch.randn(9, 6, dtype=torch.float64, requires_grad=True) for _ in range(2))
    wd = torch.randn(6, 9, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(SwiGLUMLPFunction.apply, (x, wg, wu, wd))
    w = torch.rand(6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: RMSNormFunction.apply(x, w, 1e-6), (x, w))


def test_a_whole_model_trains_the_same_with_fused_ops():
    torch.manual_seed(0)
    config = _config(vocab_size=50, num_hidden_layers=2, num_attention_heads=1)
    reference = LlamaForCausalLM(config)
    lean = copy.deepcopy(reference)
    assert apply_fused_ops(lean) == {"mlp": 2, "rms_norm": 5}  # 2 per layer and the final one
    ids = torch.randint(0, 50, (2, 12))
    for model in (reference, lean):
        model(input_ids=ids, labels=ids).loss.backward()
    loss_ref = reference(input_ids=ids, labels=ids).loss
    loss = lean(input_ids=ids, labels=ids).loss
    torch.testing.assert_close(loss, loss_ref, atol=1e-6, rtol=1e-6)
    for (name, p_ref), (_, p) in zip(
        reference.named_parameters(), lean.named_parameters(), strict=True
    ):
        torch.testing.assert_close(p.grad, p_ref.grad, atol=1e-6, rtol=1e-5, msg=name)


def test_modules_it_does_not_know_are_left_alone():
    mlp_with_bias = LlamaMLP(_config(mlp_bias=True))
    gelu_mlp = LlamaMLP(_config(hidden_act="gelu"))

    class OtherRMSNorm(LlamaRMSNorm):  # e.g. Gemma's, which scales by (1 + weight)
        pass

    model = nn.ModuleList([mlp_with_bias, gelu_mlp, OtherRMSNorm(8), nn.LayerNorm(8)])
    assert apply_fused_ops(model) == {"mlp": 0, "rms_norm": 0}
    assert all("forward" not in vars(m) for m in model)


def test_bf16_mlp_is_as_accurate_as_the_llama_mlp(monkeypatch):
    """In bf16 both differ from an fp64 reference by rounding; the chunked backward adds
    its weight gradients up in fp32, so its error stays that of the module it replaces."""
    monkeypatch.setattr(fused, "CHUNK_ELEMENTS", 176 * 64)
    monkeypatch.setattr(fused, "MIN_CHUNK_ROWS", 64)  # 16 chunks over 1,000 tokens
    torch.manual_seed(0)
    reference = LlamaMLP(_config()).double()
    hf = copy.deepcopy(reference).to(torch.bfloat16)
    lean = copy.deepcopy(hf)
    apply_fused_ops(lean)
    x = torch.randn(1000, 64, dtype=torch.float64)
    grad_out = torch.randn(1000, 64, dtype=torch.float64)
    exact = _grads(reference, x, grad_out)
    for name, module in (("hf", hf), ("fused", lean)):
        results = _grads(module, x.bfloat16(), grad_out.bfloat16())
        errors = [
            (got.double() - want).abs().max().item()
            for got, want in zip(
                [results[0], results[1], *results[2].values()],
                [exact[0], exact[1], *exact[2].values()],
                strict=True,
            )
        ]
        if name == "hf":
            hf_errors = errors
    for err, hf_err in zip(errors, hf_errors, strict=True):
        assert err <= 2 * hf_err + 1e-3
