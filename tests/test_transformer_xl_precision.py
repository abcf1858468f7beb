"""transformer_xl_lm in float16 / bfloat16 and under CPU autocast, against fairseq's transformer_lm in
the same dtype (tests/helpers/precision.py), at 120-token segments with a 120-token memory."""
import pytest
import torch

from tests.helpers.models import build, toy_dictionary
from tests.helpers.precision import LOW_PRECISION, assert_autocast_backward, assert_low_precision_close

SEG = 120
TXL = ["--n-layer", 2, "--d-model", 64, "--n-head", 4, "--d-head", 16, "--d-inner", 128, "--mem-len", SEG,
       "--cutoffs", "20,40", "--div-val", 2]
LM = ["--decoder-layers", 2, "--decoder-embed-dim", 64, "--decoder-ffn-embed-dim", 128,
      "--decoder-attention-heads", 4, "--tokens-per-sample", 2 * SEG]


def _tokens(d, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(d.nspecial, len(d), (2, 2 * SEG), generator=g)


def _setup(*extra):
    d = toy_dictionary(60)
    model, _ = build("transformer_xl_lm", TXL + list(extra), task="language_modeling", dictionary=d)
    baseline, _ = build("transformer_lm", LM, task="language_modeling", dictionary=d)
    tokens = _tokens(d)

    def run(m):
        """Two segments of a stream: the second attends over the first through the memory."""
        m(tokens[:, :SEG], stream_pos=0)
        return m.get_normalized_probs(m(tokens[:, SEG:], stream_pos=1), log_probs=True)

    def baseline_run(m):
        return m.get_normalized_probs(m(tokens), log_probs=True)[:, SEG:]

    return model, run, baseline, baseline_run


@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=["fp16", "bf16"])
def test_low_precision_streamed_log_probs_close_to_float32(dtype):
    """.half() / bfloat16 model: finite log-probs (float32 out of the adaptive softmax), as close to
    its float32 output as transformer_lm is to its own.  (The positional frequencies stay float32:
    cast with the model, the angles at 240 keys are off by up to ~0.5 rad in bfloat16.)"""
    model, run, baseline, baseline_run = _setup()
    with torch.no_grad():
        assert run(model.to(dtype)).dtype == torch.float32
    model.float()
    assert_low_precision_close(model, run, baseline, baseline_run, dtype)


@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=["fp16", "bf16"])
def test_low_precision_target_only_loss_close_to_float32(dtype):
    """The training loss (get_target_nll) of a low-precision model is float32 and close to float32's."""
    model, run, baseline, baseline_run = _setup()
    target = _tokens(model.decoder.dictionary, seed=1)[:, :SEG]

    def loss_run(m):
        m(target, stream_pos=0)
        return m.get_target_nll(m(target, stream_pos=1), target)

    def baseline_loss(m):
        lp = m.get_normalized_probs(m(torch.cat([target, target], 1)), log_probs=True)[:, SEG:]
        return -lp.gather(-1, target.unsqueeze(-1)).squeeze(-1)

    assert_low_precision_close(model, loss_run, baseline, baseline_loss, dtype)


def test_autocast_bf16_forward_backward_finite():
    """Under torch.autocast("cpu", bfloat16): forward + backward through memory, relative attention
    and the adaptive softmax give finite outputs and gradients."""
    model, run, _, _ = _setup("--untie-r")
    out = assert_autocast_backward(model, run, torch.bfloat16)
    assert out.shape == (2, SEG, 64)


@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=["fp16", "bf16"])
def test_low_precision_model_keeps_relative_positions_exact(dtype):
    """R of a model cast to half precision is the float32 sinusoid rounded once: the frequencies
    are not cast with the model (in bfloat16 they would put the angle at 700 keys off by ~1 rad)."""
    import math

    model, _, _, _ = _setup()
    model.to(dtype)
    klen, dim = 700, 64
    r = model.decoder.pos(klen, -1, dtype=dtype, device=torch.device("cpu"))
    assert r.dtype == dtype
    pos = torch.arange(klen - 1, -1, -1, dtype=torch.float64)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    angles = torch.outer(pos, inv_freq)
    exact = torch.cat([angles.sin(), angles.cos()], dim=-1)
    err = (r.double() - exact).abs().max().item()
    assert err <= 2 * torch.finfo(dtype).eps, f"R off by {err:.3g}"
    assert math.isclose(r[0, dim // 2].item(), math.cos(klen - 1), abs_tol=torch.finfo(dtype).eps)
