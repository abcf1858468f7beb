"""Half-precision checks: a model in float16 / bfloat16 and under autocast, against float32.

The tolerance is not a guess: the same input goes through a fairseq baseline of the same
size (``transformer``, ``transformer_lm``, ...) in the same dtype, and the model under
test may be off from its own float32 output by at most ``factor`` times the baseline's
error (plus a small ``floor``).  ``run(model) -> Tensor`` is a closure over integer
inputs, so the same inputs reach every copy.
"""
import copy
import json
import os

import torch
import torch.nn as nn

LOW_PRECISION = (torch.float16, torch.bfloat16)


def _float_output(model, run):
    with torch.no_grad():
        out = run(model)
    out = out[0] if isinstance(out, (tuple, list)) else out
    return out.float()


def _where_not_finite(out):
    bad = ~torch.isfinite(out)
    first = bad.nonzero()[0].tolist()
    return f"{int(bad.sum())} of {out.numel()} entries, first at index {first}"


def low_precision_error(model, run, dtype):
    """Max abs difference between ``run`` on a ``dtype`` copy of ``model`` and on a float32 copy.

    Asserts the low-precision output is finite wherever the float32 output is
    (``-inf`` log-probs of masked entries stay allowed).
    """
    model = model.eval()
    ref = _float_output(copy.deepcopy(model).float(), run)
    low = _float_output(copy.deepcopy(model).to(dtype), run)
    assert low.shape == ref.shape, f"{dtype}: output shape {tuple(low.shape)} != float32 {tuple(ref.shape)}"
    finite = torch.isfinite(ref)
    assert torch.isfinite(low[finite]).all(), f"{dtype}: non-finite output: {_where_not_finite(low[finite])}"
    if not finite.any():
        return 0.0
    return (low[finite] - ref[finite]).abs().max().item()


def assert_low_precision_close(model, run, baseline, baseline_run, dtype, factor=4.0, floor=1e-3):
    """``model`` in ``dtype`` is as close to its float32 output as ``baseline`` is to its own.

    Returns ``(error, baseline_error)``.
    """
    err = low_precision_error(model, run, dtype)
    base = low_precision_error(baseline, baseline_run, dtype)
    limit = factor * base + floor
    _record(dtype, err, base, limit)
    assert err <= limit, (f"{dtype}: max error vs float32 {err:.3g} > {limit:.3g} "
                          f"({factor} x the baseline's {base:.3g} + {floor})")
    return err, base


def _record(dtype, err, base, limit):
    """With ``PRECISION_REPORT=<file>`` set, appends the figures as a JSON line (the test's id
    included): ``benchmarks/mixed_precision/table.py`` makes BENCHMARKS.md's table from them."""
    path = os.environ.get("PRECISION_REPORT")
    if path:
        test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]
        with open(path, "a") as f:
            f.write(json.dumps({"test": test, "dtype": str(dtype).replace("torch.", ""), "error": err,
                                "baseline_error": base, "limit": limit}) + "\n")


def assert_autocast_backward(model, run, dtype=torch.bfloat16, seed=0):
    """Forward + backward of ``run(model)`` under CPU autocast: output and gradients finite.

    The loss is a fixed random projection of the output, so every output entry gets a gradient.
    Returns the (float32) output.
    """
    model = model.eval()
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=dtype):
        out = run(model)
        out = out[0] if isinstance(out, (tuple, list)) else out
    out = out.float()
    finite = torch.isfinite(out)
    assert finite.any(), "autocast: no finite output"
    g = torch.Generator().manual_seed(seed)
    weights = torch.randn(out.shape, generator=g)
    (out.masked_fill(~finite, 0.0) * weights).sum().backward()
    grads = [(name, p.grad) for name, p in model.named_parameters() if p.grad is not None]
    assert grads, "autocast: no parameter received a gradient"
    for name, grad in grads:
        assert torch.isfinite(grad).all(), f"autocast: non-finite gradient of {name}"
    assert any(grad.abs().sum() > 0 for _, grad in grads), "autocast: every gradient is zero"
    return out.detach()


# query projections by name; a fused q/k/v projection (Transformer-XL's ``qkv_net``) has the
# query in its first third of output rows
QUERY_NAMES = ("q_proj",)
FUSED_QKV_NAMES = ("qkv_net",)


def sharpen_attention(model, scale=8.0):
    """Multiplies the query projections of every attention module by ``scale`` (in place).

    Larger logits make attention near one-hot: the input that overflows float16 Gram
    matrices and exposes low-precision softmaxes.  Returns how many projections changed
    (a test asserts it is > 0, so a renamed projection cannot slip by).
    """
    count = 0
    with torch.no_grad():
        for module_name, module in model.named_modules():
            leaf = module_name.rsplit(".", 1)[-1]
            if not isinstance(module, nn.Linear) or leaf not in QUERY_NAMES + FUSED_QKV_NAMES:
                continue
            rows = module.out_features // 3 if leaf in FUSED_QKV_NAMES else module.out_features
            module.weight[:rows].mul_(scale)
            if module.bias is not None:
                module.bias[:rows].mul_(scale)
            count += 1
    return count
