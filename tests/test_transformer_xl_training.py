"""transformer_xl_lm training side: target-only loss, caches that cannot go stale, training memory
kept across validation, activation checkpointing, adaptive input without host syncs."""
import copy

import pytest
import torch
import torch.nn.functional as F

from tests.helpers.host_sync import count_host_syncs
from tests.helpers.models import build, toy_dictionary
from user_dir.tasks.bptt_lm import StreamDataset

TINY = ["--n-layer", 2, "--d-model", 16, "--n-head", 2, "--d-head", 8, "--d-inner", 32]
ADAPTIVE = ["--cutoffs", "10,20,30", "--d-embed", 24]


def _model(*extra, vocab=40, seed=0):
    return build("transformer_xl_lm", TINY + list(extra), task="language_modeling",
                 dictionary=toy_dictionary(vocab), seed=seed)


def _stream(d, n=80, batch_size=2, tokens_per_sample=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.cat([torch.tensor([d.eos()]), torch.randint(d.nspecial, len(d), (n,), generator=g)])
    return StreamDataset(tokens, batch_size, tokens_per_sample, pad=d.pad())


def _batches(ds):
    return [ds.collater([ds[i]]) for i in range(len(ds))]


# ------------------------------------------------------------- target-only loss
@pytest.mark.parametrize("extra", [[], ADAPTIVE, ADAPTIVE + ["--div-val", 2], ADAPTIVE + ["--div-val", 2,
                                                                                           "--tie-projs", "all"]])
def test_target_only_loss_equals_full_log_softmax_values_and_gradients(extra):
    """projected_adaptive_loss == cross_entropy (full log-probs) to 1e-5, loss and every gradient,
    with padded targets (a stream that ran out)."""
    from fairseq.criterions.cross_entropy import CrossEntropyCriterion

    from user_dir.criterions.projected_adaptive_loss import ProjectedAdaptiveLossCriterion

    model, d = _model("--mem-len", 4, *extra, vocab=44)
    model.train()
    ds = _stream(d, n=23, batch_size=2, tokens_per_sample=7)  # 12 + 11 targets: the last batch is padded
    sample = _batches(ds)[-1]
    assert sample["target"].eq(d.pad()).any()
    task = type("T", (), {"target_dictionary": d})()
    results = []
    for crit in (CrossEntropyCriterion(task, False), ProjectedAdaptiveLossCriterion(task, False)):
        model.zero_grad()
        net = dict(sample["net_input"])
        net.pop("stream_pos")
        torch.manual_seed(1)  # the same dropout masks
        loss, size, log = crit(model, {**sample, "net_input": net})
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (ref, ref_grads), (ours, our_grads) = results
    assert ours.dtype == torch.float32 and torch.allclose(ours, ref, rtol=0, atol=1e-5), (ours, ref)
    assert ref_grads.keys() == our_grads.keys()
    for name in ref_grads:
        assert torch.allclose(our_grads[name], ref_grads[name], rtol=1e-4, atol=1e-5), name


def test_target_only_loss_builds_no_vocabulary_sized_tensor():
    """The tail clusters are computed only for their targets' rows: no (N, V) log-probs."""
    model, d = _model("--mem-len", 4, *ADAPTIVE, vocab=44)
    hidden = torch.randn(3, 6, 16)
    target = torch.full((3, 6), 5)
    target[0, 0] = 40  # one target in the last cluster
    sizes = []
    orig = model.decoder.softmax._log_softmax

    def recording(h, *band):
        out = orig(h, *band)
        sizes.append(tuple(out.shape))
        return out

    model.decoder.softmax._log_softmax = recording
    nll = model.get_target_nll((hidden, None), target)
    assert nll.shape == (3, 6)
    assert sizes == [(18, 10 + 3), (1, 48 - 30)]  # head for all 18 rows, the last cluster for one row


def test_criterion_rejects_a_model_without_target_nll():
    from user_dir.criterions.projected_adaptive_loss import ProjectedAdaptiveLossCriterion

    model, d = build("transformer_lm", ["--decoder-layers", 1, "--decoder-embed-dim", 8,
                                        "--decoder-ffn-embed-dim", 8, "--decoder-attention-heads", 2],
                     task="language_modeling")
    crit = ProjectedAdaptiveLossCriterion(type("T", (), {"target_dictionary": d})(), False)
    tokens = torch.randint(4, len(d), (2, 5))
    with pytest.raises(ValueError, match="projected_adaptive_loss needs a model with get_target_nll"):
        crit(model, {"net_input": {"src_tokens": tokens}, "target": tokens, "ntokens": 10})


# ------------------------------------------------------------------ caches
def _validate(model, batches):
    """Sum of target log-probs over an evaluation pass over the streams (with memory)."""
    model.eval()
    total = 0.0
    with torch.no_grad():
        for sample in batches:
            lp = model.get_normalized_probs(model(**sample["net_input"]), log_probs=True)
            tgt = sample["target"]
            total += lp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)[tgt.ne(1)].sum().double()
    return total


def _cache_free(model, batches):
    """The same pass on a fresh copy of the weights (a model that never cached anything)."""
    fresh, _ = _model(*_ARGS)
    fresh.load_state_dict(model.state_dict())
    return _validate(fresh, batches)


_ARGS = ["--mem-len", 6, "--cutoffs", "10,20", "--dropout", 0.1]


def _fairseq_adam_step(model, sample, eval_mode=False):
    """One update as fairseq's trainer makes it (FairseqAdam writes p.data: no _version bump)."""
    from fairseq.optim.adam import FairseqAdam
    from omegaconf import OmegaConf

    if not eval_mode:
        model.train()
    opt = FairseqAdam(OmegaConf.create({"lr": [0.05], "adam_betas": "(0.9, 0.999)", "adam_eps": 1e-8,
                                        "weight_decay": 0.0, "use_old_adam": False, "fp16_adam_stats": False,
                                        "tpu": False}), list(model.parameters()))
    net = dict(sample["net_input"])
    net.pop("stream_pos")  # (stateless: leaves the stream memories alone)
    lp = model.get_normalized_probs(model(**net), log_probs=True)
    F.nll_loss(lp.view(-1, lp.size(-1)), sample["target"].view(-1), ignore_index=1).backward()
    versions = [p._version for p in model.parameters()]
    opt.step()
    assert [p._version for p in model.parameters()] == versions  # (the writes are invisible to _version)


@pytest.mark.parametrize("n_valid", [10, 60])  # one segment, many segments
def test_no_cache_survives_a_fairseq_optimizer_step(n_valid):
    """Two validations with a FairseqAdam step in between: the second == a cache-free pass."""
    model, d = _model(*_ARGS)
    valid = _batches(_stream(d, n=n_valid, seed=1))
    train = _batches(_stream(d, n=60, seed=2))
    first = _validate(model, valid)
    assert first == _cache_free(model, valid)
    _fairseq_adam_step(model, train[0])
    second = _validate(model, valid)
    assert abs(second - first) > 1e-2  # the step changed the model ...
    assert second == _cache_free(model, valid)  # ... and the second validation saw all of it


def test_no_cache_survives_a_step_in_the_middle_of_an_evaluation_stream():
    """Even an update made in eval mode between two segments of one evaluation pass: the key/values
    and W_kR R cached by the first segments are not reused with the new weights."""
    model, d = _model(*_ARGS)
    valid = _batches(_stream(d, n=60, seed=1))
    _validate(model, valid[:3])
    assert model.decoder._stream_mems["eval"]["cache"] is not None
    mems = [m.clone() for m in model.decoder._stream_mems["eval"]["mems"]]
    _fairseq_adam_step(model, _batches(_stream(d, n=60, seed=2))[0], eval_mode=True)
    ref, _ = _model(*_ARGS)
    ref.load_state_dict(model.state_dict())
    with torch.no_grad():
        out = model(**valid[3]["net_input"])[0]
        expected = ref.eval().decoder.extract_features(valid[3]["net_input"]["src_tokens"], mems)[0]
    assert torch.equal(out, expected)


# ------------------------------------------------------- memory across validation
def _train_losses(validate_after=None):
    """Training losses over a stream, the task's begin_valid_epoch + a validation pass after batch
    ``validate_after`` (as ``--validate-interval-updates`` does mid-epoch)."""
    from types import SimpleNamespace

    from user_dir.tasks.bptt_lm import BPTTLanguageModelingTask

    model, d = _model(*_ARGS)
    task = BPTTLanguageModelingTask(SimpleNamespace(), d)
    train, valid = _batches(_stream(d, n=60, seed=2)), _batches(_stream(d, n=30, seed=1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    task.begin_epoch(1, model)
    losses = []
    for i, sample in enumerate(train):
        model.train()
        torch.manual_seed(i)
        lp = model.get_normalized_probs(model(**sample["net_input"]), log_probs=True)
        loss = F.nll_loss(lp.view(-1, lp.size(-1)), sample["target"].view(-1), ignore_index=d.pad())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if i == validate_after:
            task.begin_valid_epoch(1, model)
            _validate(model, valid)
    return losses


def test_validation_mid_epoch_keeps_the_training_memory():
    """Training after a mid-epoch validation continues exactly as without it (same losses)."""
    plain = _train_losses()
    assert len(plain) > 5
    assert _train_losses(validate_after=2) == plain


# ------------------------------------------------------------ checkpointing
@pytest.mark.parametrize("extra", [[], ["--pre-lnorm", "--untie-r", "--div-val", 2, *ADAPTIVE]])
def test_checkpoint_activations_equal_loss_and_gradients(extra):
    """--checkpoint-activations: the same loss and gradients (dropout and dropatt on: the recomputed
    forward draws the same masks), memory carried across two segments."""
    args = ["--mem-len", 5, "--dropout", 0.2, "--dropatt", 0.2, *extra]
    results = []
    for ckpt in ([], ["--checkpoint-activations"]):
        model, d = _model(*args, *ckpt, vocab=44)
        model.train()
        out = []
        for i, sample in enumerate(_batches(_stream(d, n=40, seed=3))[:2]):
            model.zero_grad()
            torch.manual_seed(i)
            net_output = model(**sample["net_input"])
            loss = model.get_target_nll(net_output, sample["target"]).sum()
            loss.backward()
            out.append((loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
        results.append(out)
    assert hasattr(model.decoder.layers[0], "precheckpoint_forward")  # (the layers were wrapped)
    for (loss_a, grads_a), (loss_b, grads_b) in zip(*results):
        assert abs(loss_a - loss_b) <= 1e-5 * abs(loss_a)
        assert grads_a.keys() == grads_b.keys() and len(grads_a) > 10
        for name in grads_a:
            assert torch.allclose(grads_a[name], grads_b[name], rtol=1e-4, atol=1e-6), name


# ------------------------------------------------------------ adaptive input
def _reference_adaptive_embedding(emb, tokens):
    """The reference's per-band gather/scatter (``AdaptiveEmbedding.forward`` of mem_transformer.py)."""
    flat = tokens.reshape(-1)
    out = torch.zeros(flat.size(0), emb.d_proj)
    for i, (lo, hi) in enumerate(zip(emb.edges[:-1], emb.edges[1:])):
        idx = ((flat >= lo) & (flat < hi)).nonzero().squeeze(1)
        out[idx] = F.linear(emb.emb_layers[i](flat[idx] - lo), emb.emb_projs[i])
    return (out * emb.emb_scale).view(*tokens.shape, emb.d_proj)


def test_adaptive_input_div_val_equals_the_reference_gather_without_host_syncs():
    from user_dir.modules.projected_adaptive import AdaptiveEmbedding

    torch.manual_seed(0)
    emb = AdaptiveEmbedding(50, 32, 16, [10, 20, 35], div_val=2)
    for p in emb.parameters():
        torch.nn.init.normal_(p)
    tokens = torch.randint(0, 50, (3, 11))
    tokens[0, :4] = torch.tensor([0, 9, 10, 49])  # band edges
    weights = torch.randn(3, 11, 16)
    ours = emb(tokens)
    ref = _reference_adaptive_embedding(emb, tokens)
    assert torch.allclose(ours, ref, atol=1e-5)
    g_ours = torch.autograd.grad((ours * weights).sum(), list(emb.parameters()))
    g_ref = torch.autograd.grad((ref * weights).sum(), list(emb.parameters()))
    for a, b in zip(g_ours, g_ref):
        assert torch.allclose(a, b, atol=1e-4)
    with count_host_syncs() as syncs:
        emb(tokens)
    assert syncs == []


@pytest.mark.parametrize("training", [False, True])
def test_forward_makes_no_host_sync(training):
    """A streamed forward (memory, adaptive input with div_val 2, evaluation caches) reads nothing
    back to the host."""
    model, d = _model("--mem-len", 6, "--div-val", 2, *ADAPTIVE, vocab=44)
    model.train(training)
    batches = _batches(_stream(d, n=40, seed=4))
    with torch.set_grad_enabled(training), count_host_syncs() as syncs:
        for sample in batches[:3]:
            model(**sample["net_input"])
    assert syncs == [], syncs
    if not training:  # generation: incremental steps with a beam reorder
        tokens, state = batches[0]["net_input"]["src_tokens"], {}
        with torch.no_grad(), count_host_syncs() as syncs:
            for t in range(1, 4):
                model.decoder(tokens[:, :t], incremental_state=state)
                model.decoder.reorder_incremental_state_scripting(state, torch.tensor([1, 0]))
        assert state and syncs == [], syncs
