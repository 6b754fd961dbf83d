"""Memory-lean SwiGLU MLP and RMSNorm for Llama-family models, in plain PyTorch.

The Hugging Face modules keep every intermediate of the MLP for the backward
pass: the gate projection ``a``, ``silu(a)``, the up projection ``b`` and the
product ``silu(a) * b``, four tensors of the intermediate size per token and
layer, which are most of the activation memory of a Llama block. The fused
MLP keeps only its input, ``a`` and ``b``, and recomputes ``silu(a) * b`` in
the backward pass, a few element-wise operations; its backward works through
the tokens in chunks, so its temporaries stay small too. The fused RMSNorm
keeps its input and the per-token ``1 / rms`` instead of the normalised input.

The results are those of the modules they replace (the same formulas, so equal
up to floating-point rounding; the tests compare outputs and gradients). This
is the idea of Liger Kernel's SwiGLU and RMSNorm, written as autograd
functions rather than Triton kernels so that it runs on any device.

:func:`apply_fused_ops` swaps the ``forward`` of the modules it recognises, by
class name, and leaves every other module alone. ZeRO-3 is excluded: it gathers
a partitioned weight only when its own module is called, and the fused MLP
reads the three projection weights directly.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn

# Classes whose forward is exactly: down(silu(gate(x)) * up(x)), bias-free.
SWIGLU_MLPS = frozenset({"LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP"})
# Activation modules whose forward is exactly F.silu (torch's and transformers' own).
SILU_ACTIVATIONS = frozenset({"SiLU", "SiLUActivation"})
# Classes whose forward is exactly: weight * (x / rms(x)), computed in fp32.
RMS_NORMS = frozenset({"LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm"})

# Elements of the intermediate size per chunk in the MLP backward (at least
# MIN_CHUNK_ROWS tokens per chunk, so that the matrix products stay efficient).
CHUNK_ELEMENTS = 2**20
MIN_CHUNK_ROWS = 256


class SwiGLUMLPFunction(torch.autograd.Function):
    """``y = (silu(x Wg^T) * (x Wu^T)) Wd^T``, saving ``x``, ``x Wg^T`` and ``x Wu^T``."""

    @staticmethod
    def forward(ctx, x, w_gate, w_up, w_down):
        a = F.linear(x, w_gate)
        b = F.linear(x, w_up)
        h = F.silu(a).mul_(b)
        y = F.linear(h, w_down)
        ctx.save_for_backward(x, a, b, w_gate, w_up, w_down)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x, a, b, w_gate, w_up, w_down = ctx.saved_tensors
        hidden, inter = x.shape[-1], a.shape[-1]
        x2, a2, b2 = x.reshape(-1, hidden), a.reshape(-1, inter), b.reshape(-1, inter)
        gy2 = grad_y.reshape(-1, hidden)
        rows = x2.shape[0]
        grad_x = torch.empty_like(x2)
        # Weight gradients add up over the chunks in fp32 when the weights are 16-bit.
        acc = torch.promote_types(w_gate.dtype, torch.float32)
        grad_gate, grad_up, grad_down = (
            torch.zeros(w.shape, dtype=acc, device=w.device) for w in (w_gate, w_up, w_down)
        )
        step = max(MIN_CHUNK_ROWS, CHUNK_ELEMENTS // inter)
        for start in range(0, rows, step):
            sl = slice(start, start + step)
            a_c, b_c, gy_c, x_c = a2[sl], b2[sl], gy2[sl], x2[sl]
            sig = torch.sigmoid(a_c)
            silu = a_c * sig
            _accumulate(grad_down, gy_c.t(), silu * b_c)  # dL/dWd = gy^T h
            grad_h = gy_c @ w_down  # (chunk, inter)
            grad_b = silu.mul_(grad_h)  # dL/db = gh * silu(a); silu is not needed again
            # dL/da = gh * b * silu'(a), silu'(a) = sig * (1 + a * (1 - sig))
            dsilu = torch.sub(1, sig).mul_(a_c).add_(1).mul_(sig)
            grad_a = grad_h.mul_(b_c).mul_(dsilu)
            del sig, dsilu
            _accumulate(grad_gate, grad_a.t(), x_c)
            _accumulate(grad_up, grad_b.t(), x_c)
            torch.mm(grad_a, w_gate, out=grad_x[sl])
            grad_x[sl].addmm_(grad_b, w_up)
        return (
            grad_x.view_as(x),
            grad_gate.to(w_gate.dtype),
            grad_up.to(w_up.dtype),
            grad_down.to(w_down.dtype),
        )


def _accumulate(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``out += a @ b``, in place; the product is formed in a and b's dtype."""
    if out.dtype == a.dtype:
        out.addmm_(a, b)
    else:
        out.add_(a @ b)


class RMSNormFunction(torch.autograd.Function):
    """``weight * (x * rsqrt(mean(x^2) + eps))`` in fp32 (or x's dtype when wider), saving
    ``x`` and the rsqrt."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        y = weight * (xf * rstd).to(x.dtype)
        ctx.save_for_backward(x, weight, rstd)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x, weight, rstd = ctx.saved_tensors
        xhat = x.to(rstd.dtype) * rstd
        gy = grad_y.to(rstd.dtype)
        grad_w = (gy * xhat).reshape(-1, x.shape[-1]).sum(0).to(weight.dtype)
        grad_xhat = gy * weight.to(rstd.dtype)
        dot = (grad_xhat * xhat).mean(-1, keepdim=True)
        grad_x = grad_xhat.sub_(xhat.mul_(dot)).mul_(rstd)
        return grad_x.to(x.dtype), grad_w, None


def _mlp_forward(self, x):
    return SwiGLUMLPFunction.apply(
        x, self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight
    )


def _rms_norm_forward(self, x):
    return RMSNormFunction.apply(x, self.weight, self.variance_epsilon)


def _is_plain_swiglu(module: nn.Module) -> bool:
    projections = [getattr(module, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
    return (
        type(module).__name__ in SWIGLU_MLPS
        and all(type(p) is nn.Linear and p.bias is None for p in projections)
        and type(getattr(module, "act_fn", None)).__name__ in SILU_ACTIVATIONS
    )


def apply_fused_ops(model: nn.Module) -> dict[str, int]:
    """Give the recognised MLP and RMSNorm modules of ``model`` the fused forward, in place;
    return how many of each were swapped."""
    counts = {"mlp": 0, "rms_norm": 0}
    for module in model.modules():
        if _is_plain_swiglu(module):
            module.forward = types.MethodType(_mlp_forward, module)
            counts["mlp"] += 1
        elif type(module).__name__ in RMS_NORMS and hasattr(module, "variance_epsilon"):
            module.forward = types.MethodType(_rms_norm_forward, module)
            counts["rms_norm"] += 1
    return counts
