"""Parity with HuggingFace ``transformers==4.35.2`` ``TransfoXLLMHeadModel`` (test-only oracle).

Identical random weights go into both models; log-probabilities and
memories must agree to 1e-5 over three consecutive segments.
"""
import warnings

import pytest
import torch

from tests.helpers.models import build, toy_dictionary
from user_dir.models.transformer_xl_lm import state_dict_from_hf

transformers = pytest.importorskip("transformers")

N_LAYER, D_MODEL, N_HEAD, D_HEAD, D_INNER = 2, 16, 2, 8, 24

CASES = {
    # name: (our flags, HF config overrides)
    "full_softmax_shared_r": (dict(mem_len=6, untie_r=False), {}),
    "adaptive_untied_r_same_length_clamp": (
        dict(mem_len=6, untie_r=True, cutoffs=[10, 20], same_length=True, clamp_len=3), {}),
    "div_val2_shared_r_clamp": (dict(mem_len=5, untie_r=False, cutoffs=[10, 20], div_val=2, clamp_len=4), {}),
    "div_val1_projected_pre_norm": (
        dict(mem_len=7, untie_r=True, cutoffs=[12], d_embed=8, pre_lnorm=True, same_length=True), {}),
}


def _flags(opts):
    flags = ["--n-layer", N_LAYER, "--d-model", D_MODEL, "--n-head", N_HEAD, "--d-head", D_HEAD,
             "--d-inner", D_INNER, "--dropout", 0, "--dropatt", 0]
    for key, value in opts.items():
        name = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            flags += [name] if value else []
        elif isinstance(value, list):
            flags += [name, ",".join(map(str, value))]
        else:
            flags += [name, value]
    return flags


def _hf_model(opts, vocab):
    from transformers import TransfoXLConfig, TransfoXLLMHeadModel

    cutoffs = opts.get("cutoffs", [])
    config = TransfoXLConfig(
        vocab_size=vocab, cutoffs=list(cutoffs), d_model=D_MODEL, d_embed=opts.get("d_embed", D_MODEL),
        n_head=N_HEAD, d_head=D_HEAD, d_inner=D_INNER, div_val=opts.get("div_val", 1), n_layer=N_LAYER,
        mem_len=opts["mem_len"], clamp_len=opts.get("clamp_len", -1), same_length=opts.get("same_length", False),
        pre_lnorm=opts.get("pre_lnorm", False), untie_r=opts.get("untie_r", False), dropout=0.0, dropatt=0.0,
        proj_share_all_but_first=True, trainer_compatible=True,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = TransfoXLLMHeadModel(config)
    torch.manual_seed(123)
    with torch.no_grad():  # random values everywhere (not the init's zeros and ones)
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model.eval()


@pytest.mark.parametrize("case", sorted(CASES))
def test_parity_with_huggingface(case):
    opts, _ = CASES[case]
    d = toy_dictionary(36)  # 40 symbols
    ours, _ = build("transformer_xl_lm", _flags(opts), task="language_modeling", dictionary=d)
    hf = _hf_model(opts, len(d))
    ours.load_state_dict(state_dict_from_hf(hf.state_dict(), ours.decoder))
    # every parameter of ours was set from HF (no leftover init values)
    n_ours = sum(p.numel() for p in ours.parameters())
    n_hf = sum(p.numel() for p in hf.parameters())
    assert n_ours == n_hf, (n_ours, n_hf)

    g = torch.Generator().manual_seed(7)
    bsz, seg = 3, 5
    mems_ours = None
    mems_hf = [torch.zeros(0, bsz, D_MODEL) for _ in range(N_LAYER)]
    with torch.no_grad():
        for step in range(4):
            tokens = torch.randint(0, len(d), (bsz, seg), generator=g)
            hid, extra = ours.decoder(tokens, mems=mems_ours)
            lp_ours = ours.get_normalized_probs((hid, extra), log_probs=True)
            out_hf = hf(input_ids=tokens, mems=mems_hf, return_dict=True)
            lp_hf = out_hf.prediction_scores
            diff = (lp_ours - lp_hf).abs().max().item()
            assert diff < 1e-5, f"segment {step}: log-probs differ by {diff:.3g}"
            assert torch.allclose(lp_ours.exp().sum(-1), torch.ones(bsz, seg), atol=1e-5)
            mems_ours, mems_hf = extra["mems"], out_hf.mems
            assert len(mems_ours) == len(mems_hf) == N_LAYER
            for layer, (a, b) in enumerate(zip(mems_ours, mems_hf)):
                assert a.shape == b.transpose(0, 1).shape
                mdiff = (a - b.transpose(0, 1)).abs().max().item()
                assert mdiff < 1e-5, f"segment {step}, layer {layer}: memories differ by {mdiff:.3g}"
    # the memory is full and really used: dropping it changes the output
    assert mems_ours[0].size(1) == opts["mem_len"]
    with torch.no_grad():
        alone = ours.get_normalized_probs(ours.decoder(tokens), log_probs=True)
    assert (alone - lp_ours).abs().max().item() > 1e-3


def _grads_by_name(model):
    """Gradient of every parameter under every name it has (tied weights appear under each name)."""
    return {n: (p.grad if p.grad is not None else torch.zeros_like(p))
            for n, p in model.named_parameters(remove_duplicate=False)}


@pytest.mark.parametrize("case", sorted(CASES))
def test_gradient_parity_with_huggingface(case):
    """Training-mode forward + backward over three segments with memory: every parameter's gradient
    equals HF's.  Guards the training path (what the forward parity cannot see: a term cut off from
    autograd, a wrong in-place op, a tied weight that does not receive both gradients)."""
    opts, _ = CASES[case]
    d = toy_dictionary(36)
    ours, _ = build("transformer_xl_lm", _flags(opts), task="language_modeling", dictionary=d)
    hf = _hf_model(opts, len(d))
    ours.load_state_dict(state_dict_from_hf(hf.state_dict(), ours.decoder))
    ours.train()
    hf.train()
    g = torch.Generator().manual_seed(11)
    bsz, seg = 3, 5
    mems_ours, mems_hf = None, [torch.zeros(0, bsz, D_MODEL) for _ in range(N_LAYER)]
    for step in range(3):
        tokens = torch.randint(0, len(d), (bsz, seg), generator=g)
        target = torch.randint(0, len(d), (bsz, seg), generator=g).unsqueeze(-1)
        hid, extra = ours.decoder(tokens, mems=mems_ours)
        loss_ours = -ours.get_normalized_probs((hid, extra), log_probs=True).gather(-1, target).mean()
        out_hf = hf(input_ids=tokens, mems=mems_hf, return_dict=True)
        loss_hf = -out_hf.prediction_scores.gather(-1, target).mean()
        assert abs(loss_ours.item() - loss_hf.item()) < 1e-5
        ours.zero_grad()
        hf.zero_grad()
        loss_ours.backward()
        loss_hf.backward()
        mems_ours, mems_hf = extra["mems"], out_hf.mems
        ours_grads = _grads_by_name(ours)
        expected = state_dict_from_hf(_grads_by_name(hf), ours.decoder)
        checked = 0
        for name, grad in expected.items():
            if name == "decoder.vocab_size":
                continue
            diff = (ours_grads[name] - grad).abs().max().item()
            assert diff <= 1e-5 * max(1.0, grad.abs().max().item()), f"segment {step}: grad of {name} off by {diff:.3g}"
            checked += 1
        assert checked == len(ours_grads)  # every named parameter of ours was compared
        assert any(g.abs().max().item() > 1e-4 for g in ours_grads.values())
