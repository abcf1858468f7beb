"""The recurrent FastTrees cell and ON-LSTM (user_dir/modules/ordered_neurons.py, models onlstm_* and
fasttrees_lstm_*): the layer against the equations written out step by step, parallel master gates against
gates computed step by step, causality, incremental = full, beam reorder with distinct rows, padding, half
precision, flag errors."""
import pytest
import torch
import torch.nn.functional as F
from fairseq.data import data_utils

from tests.helpers import beam, invariance, precision
from tests.helpers.models import build, prev_output, random_sentences
from user_dir.modules.ordered_neurons import OrderedNeuronsLayer

TINY = ["--embed-dim", 16, "--hidden-size", 24, "--num-layers", 2, "--chunk-size", 4]
NO_DROPOUT = ["--dropout", 0, "--hidden-dropout", 0, "--input-dropout", 0, "--embed-dropout", 0, "--weight-drop", 0]
LMS = {
    "onlstm": ("onlstm_lm", []),
    "fasttrees_ffn": ("fasttrees_lstm_lm", []),
    "fasttrees_linear": ("fasttrees_lstm_lm", ["--master", "linear"]),
    "fasttrees_conv": ("fasttrees_lstm_lm", ["--master", "conv", "--conv-kernel-size", 3]),
    "lstm_ablation": ("fasttrees_lstm_lm", ["--master", "none"]),
}
LM_VARIANTS = pytest.mark.parametrize("variant", sorted(LMS))


def lm(variant, extra=()):
    arch, flags = LMS[variant]
    return build(arch, [*TINY, *NO_DROPOUT, *flags, *extra], task="language_modeling")


def cumax(x):
    return torch.cumsum(torch.softmax(x, -1), -1)


def written_out(layer, x, master_of_t):
    """The module docstring's equations, one time step and one gate at a time, in float64."""
    H, C, n = layer.hidden_size, layer.chunk_size, layer.n_chunk
    W, b, U = layer.ih.weight.double(), layer.ih.bias.double(), layer.weight_hh.double()
    h, c = torch.zeros(x.size(1), H, dtype=torch.float64), torch.zeros(x.size(1), H, dtype=torch.float64)
    outputs = []
    for t in range(x.size(0)):
        pre = x[t].double() @ W.t() + b + h @ U.t()
        if layer.recurrent_master:
            f_m, i_m = cumax(pre[:, :n]), 1 - cumax(pre[:, n:2 * n])
            pre = pre[:, 2 * n:]
        else:
            m = master_of_t(t).double()
            f_m, i_m = cumax(m[:, :n]), 1 - cumax(m[:, n:])
        o, c_hat, i, f = (pre[:, k * H:(k + 1) * H] for k in range(4))
        f_m, i_m = f_m.repeat_interleave(C, -1), i_m.repeat_interleave(C, -1)  # a master value per chunk
        w = f_m * i_m
        f_hat = torch.sigmoid(f) * w + (f_m - w)
        i_hat = torch.sigmoid(i) * w + (i_m - w)
        c = f_hat * c + i_hat * torch.tanh(c_hat)
        h = torch.sigmoid(o) * torch.tanh(c)
        outputs.append(h)
    return torch.stack(outputs)


@pytest.mark.parametrize("master", ["recurrent", "ffn", "linear", "conv"])
def test_layer_equals_the_equations_written_out(master):
    torch.manual_seed(0)
    layer = OrderedNeuronsLayer(6, 12, 3, master=master, conv_kernel_size=3).eval()
    x = torch.randn(9, 2, 6)
    with torch.no_grad():
        got, (h, c), f_master, _ = layer(x)
        master_x = None if layer.master_net is None else layer.master_net(x)[0]
    ref = written_out(layer, x, lambda t: master_x[t])
    assert torch.allclose(got.double(), ref, atol=1e-5)
    assert torch.allclose(h.double(), ref[-1], atol=1e-5)
    assert f_master.shape == (9, 2, 4) and torch.allclose(f_master[..., -1], torch.ones(9, 2))  # cumax ends at 1


def test_without_master_gates_the_layer_is_torch_lstm():
    """``master="none"`` (the ablation) is the standard LSTM: torch's ``nn.LSTM`` with the same weights, whose
    gate rows are [i | f | g | o] where the layer's are [o | ĉ | i | f]."""
    torch.manual_seed(0)
    layer = OrderedNeuronsLayer(6, 12, 3, master="none").eval()
    lstm = torch.nn.LSTM(6, 12)
    order = [2, 3, 1, 0]  # torch's i, f, g, o among the layer's o, ĉ, i, f
    with torch.no_grad():
        lstm.weight_ih_l0.copy_(torch.cat([layer.ih.weight.view(4, 12, 6)[k] for k in order]))
        lstm.bias_ih_l0.copy_(torch.cat([layer.ih.bias.view(4, 12)[k] for k in order]))
        lstm.weight_hh_l0.copy_(torch.cat([layer.weight_hh.view(4, 12, 12)[k] for k in order]))
        lstm.bias_hh_l0.zero_()
        x = torch.randn(9, 2, 6)
        got, (h, c), f_master, _ = layer(x)
        ref, (h_ref, c_ref) = lstm(x)
    assert torch.allclose(got, ref, atol=1e-6) and torch.allclose(c, c_ref[0], atol=1e-6)
    assert torch.equal(f_master, torch.ones(9, 2, 4))  # no master gates: syntactic distance 0
    assert sum(p.numel() for p in layer.parameters()) == sum(p.numel() for p in lstm.parameters()) - 4 * 12


@pytest.mark.parametrize("master", ["ffn", "linear", "conv"])
def test_parallel_master_gates_equal_gates_computed_step_by_step(master):
    torch.manual_seed(1)
    layer = OrderedNeuronsLayer(6, 12, 3, master=master, conv_kernel_size=3).eval()
    x = torch.randn(8, 2, 6)
    with torch.no_grad():
        whole, _ = layer.master_net(x)
        window, steps = None, []
        for t in range(x.size(0)):
            step, window = layer.master_net(x[t:t + 1], window)
            steps.append(step)
    assert torch.allclose(torch.cat(steps), whole, atol=1e-6)


def test_conv_master_gates_are_causal():
    torch.manual_seed(2)
    layer = OrderedNeuronsLayer(6, 12, 3, master="conv", conv_kernel_size=3).eval()
    x = torch.randn(8, 1, 6)
    changed = x.clone()
    changed[5:] = torch.randn(3, 1, 6)
    with torch.no_grad():
        a, b = layer.master_net(x)[0], layer.master_net(changed)[0]
    assert torch.equal(a[:5], b[:5]) and not torch.allclose(a[5:], b[5:])


@pytest.mark.parametrize("master", ["recurrent", "ffn", "linear", "conv", "none"])
def test_padding_on_either_side_changes_nothing(master):
    """Whatever the padded steps hold, a sequence's outputs, master gates and final state are those it has
    alone: padding after it (right) and before it (left, where the conv window must start empty)."""
    torch.manual_seed(4)
    layer = OrderedNeuronsLayer(6, 12, 3, master=master, conv_kernel_size=3).eval()
    x = torch.randn(5, 1, 6)
    padded = torch.cat([torch.randn(3, 1, 6), x, torch.randn(2, 1, 6)])
    keep = torch.tensor([False] * 3 + [True] * 5 + [False] * 2).unsqueeze(1)
    with torch.no_grad():
        h, (h_n, c_n), f_master, _ = layer(x)
        h_p, (h_pn, c_pn), f_master_p, _ = layer(padded, keep=keep)
    assert torch.allclose(h_p[3:8], h, atol=1e-6) and torch.allclose(f_master_p[3:8], f_master, atol=1e-6)
    assert torch.allclose(h_pn, h_n, atol=1e-6) and torch.allclose(c_pn, c_n, atol=1e-6)


def test_fasttrees_master_gates_do_not_read_the_hidden_state():
    """FastTrees' f̃_t depends on x_t only; ON-LSTM's on h_{t−1} too (a changed earlier token moves it)."""
    torch.manual_seed(3)
    x = torch.randn(6, 1, 6)
    changed = x.clone()
    changed[0] = torch.randn(1, 6)
    for master, moved in (("ffn", False), ("recurrent", True)):
        layer = OrderedNeuronsLayer(6, 12, 3, master=master).eval()
        with torch.no_grad():
            fa, fb = layer(x)[2], layer(changed)[2]
        assert (not torch.allclose(fa[3:], fb[3:])) == moved, master


@LM_VARIANTS
def test_language_model_causal_and_padding_invariant(variant):
    model, d = lm(variant)
    tgts = [prev_output(t, d.eos()) for t in random_sentences(d, [7, 4, 9], seed=2)]
    invariance.assert_padding_invariant(model, None, tgts, d.pad())
    invariance.assert_decoder_causal(model, None, tgts[2], d.pad(), len(d))


@LM_VARIANTS
def test_incremental_decoding_equals_full_forward(variant):
    model, d = lm(variant)
    (tgt,) = random_sentences(d, [8], seed=3)
    invariance.assert_incremental_equals_full(model, None, prev_output(tgt, d.eos()), d.pad())


@LM_VARIANTS
def test_beam_reorder_with_distinct_rows_and_a_shrinking_batch(variant):
    model, d = lm(variant)
    prefixes = [prev_output(t, d.eos()) for t in random_sentences(d, [6, 6, 6], seed=4)]
    beam.assert_beam_reorder(model, None, prefixes, d.pad())


def test_beam_reorder_check_catches_a_broken_reorder():
    model, d = lm("fasttrees_conv")
    prefixes = [prev_output(t, d.eos()) for t in random_sentences(d, [6, 6, 6], seed=4)]
    beam.assert_broken_reorder_caught(model, "noop", None, prefixes, d.pad())


@pytest.mark.parametrize("variant", ["onlstm", "fasttrees_conv"])
def test_sequence_generator_matches_forward(variant):
    """fairseq's beam search on prompts of different lengths (right-padded prefixes, as fairseq forces them):
    every hypothesis' positional scores equal a teacher-forced forward pass."""
    model, d = lm(variant)
    prompts = random_sentences(d, [5, 2, 4], seed=12, bos_eos=False)
    width = max(len(p) for p in prompts)
    prefixes = [torch.cat([p, torch.full((width - len(p),), d.pad())]) for p in prompts]
    assert beam.assert_generator_matches_forward(model, d, beam=4, max_len=8, prefix_list=prefixes)


def test_regularisation_is_on_in_training_and_off_in_evaluation():
    model, d = lm("fasttrees_ffn")
    reg, _ = build("fasttrees_lstm_lm", [*TINY, "--weight-drop", 0.5, "--embed-dropout", 0.3], task="language_modeling")
    reg.load_state_dict(model.state_dict())
    tokens = torch.stack(random_sentences(d, [8, 8], seed=5))
    reg.eval()
    model.eval()
    with torch.no_grad():
        assert torch.allclose(reg(tokens)[0], model(tokens)[0], atol=1e-6)
        reg.train()
        torch.manual_seed(0)
        a = reg(tokens)[0]
        torch.manual_seed(1)
        assert not torch.allclose(a, reg(tokens)[0])


def test_tied_output_layer_and_ptb_preset():
    model, _ = build("fasttrees_lstm_lm_ptb", [], task="language_modeling")
    cfg = model.decoder.encoder.cfg
    assert (cfg.embed_dim, cfg.hidden_size, cfg.num_layers, cfg.chunk_size) == (400, 1150, 3, 10)
    assert (cfg.dropout, cfg.hidden_dropout, cfg.input_dropout, cfg.embed_dropout, cfg.weight_drop) == (
        0.45, 0.3, 0.5, 0.1, 0.45)
    assert [layer.hidden_size for layer in model.decoder.encoder.rnn.layers] == [1150, 1150, 400]
    assert model.decoder.output_projection is None and cfg.master == "ffn"
    assert cfg.embed_init == "uniform" and model.decoder.encoder.embed_tokens.weight.abs().max() <= 0.1
    onlstm, _ = build("onlstm_lm_ptb", ["--hidden-size", 40], task="language_modeling")
    assert onlstm.decoder.encoder.cfg.hidden_size == 40  # a flag given beats the preset


def test_syntactic_distances():
    model, d = lm("fasttrees_ffn")
    tokens = torch.stack(random_sentences(d, [6, 6], seed=6))
    dist = model.syntactic_distances(tokens)
    assert dist.shape == (2, 2, 7) and ((dist >= 0) & (dist <= 1)).all()
    x = model.decoder.encoder.embed_tokens(tokens).transpose(0, 1)
    with torch.no_grad():
        f_master = model.decoder.encoder.rnn.layers[0](x)[2]
    assert torch.allclose(dist[0], (1 - f_master.mean(-1)).t(), atol=1e-6)


# --------------------------------------------------------------------------- classifiers
def classifier(arch, extra=()):
    model, d = build(arch, [*TINY, *NO_DROPOUT, "--criterion", "sentence_prediction", "--num-classes", 3, *extra],
                     task="sentence_prediction")
    return model, d


@pytest.mark.parametrize("left_pad", [False, True], ids=["right_pad", "left_pad"])
@pytest.mark.parametrize("arch, extra", [("onlstm_classifier", []), ("fasttrees_lstm_classifier", []),
                                         ("fasttrees_lstm_classifier", ["--master", "conv"])],
                         ids=["onlstm", "fasttrees_ffn", "fasttrees_conv"])
def test_classifier_alone_equals_padded_batch_and_siamese_pairs(arch, extra, left_pad):
    """Right padding checks that the final state ignores what follows a sentence; left padding, that the
    padded steps before it leave (h, c) at the zero state (cell state included) and the conv window empty."""
    model, d = classifier(arch, extra)
    model.register_classification_head("single", num_classes=3)
    model.register_classification_head("pair", num_classes=3, input_multiplier=4)
    model.eval()
    sents = random_sentences(d, [6, 3, 9], seed=7)
    batch = data_utils.collate_tokens(sents, d.pad(), left_pad=left_pad)
    with torch.no_grad():
        logits, _ = model(batch, classification_head_name="single")
        for i, s in enumerate(sents):
            assert torch.allclose(logits[i], model(s[None], classification_head_name="single")[0][0], atol=1e-5)
        pair = data_utils.collate_tokens(sents[::-1], d.pad(), left_pad=left_pad)
        both, _ = model(batch, pair_tokens=pair, classification_head_name="pair")
        u, v = model(sents[0][None])[0], model(sents[2][None])[0]
        features = torch.cat([u, v, u * v, (u - v).abs()], -1)
        assert torch.allclose(both[0], model.classification_heads["pair"](features)[0], atol=1e-5)


def test_classifier_presets():
    model, _ = build("fasttrees_lstm_classifier_conv_logic", ["--criterion", "sentence_prediction", "--num-classes", 3],
                     task="sentence_prediction")
    assert (model.cfg.embed_dim, model.cfg.hidden_size, model.cfg.num_layers, model.cfg.chunk_size) == (128, 400, 1, 10)
    assert model.cfg.master == "conv" and model.cfg.embed_init == "normal"
    assert 0.9 < model.encoder.embed_tokens.weight.std() < 1.1  # N(0, 1), not the language models' U(-0.1, 0.1)
    control, _ = build("lstm_classifier_logic", ["--criterion", "sentence_prediction", "--num-classes", 3],
                       task="sentence_prediction")
    layer = control.encoder.rnn.layers[0]
    assert control.cfg.master == "none" and layer.master_net is None and not layer.recurrent_master
    assert (control.cfg.hidden_size, control.cfg.dropout) == (400, 0.2)


# --------------------------------------------------------------------------- precision
def _lm_batch(d):
    return data_utils.collate_tokens([prev_output(t, d.eos()) for t in random_sentences(d, [60, 20, 1], seed=8)],
                                     d.pad(), left_pad=False)


@pytest.mark.parametrize("dtype", precision.LOW_PRECISION, ids=["fp16", "bf16"])
@pytest.mark.parametrize("variant", ["onlstm", "fasttrees_ffn", "fasttrees_conv"])
def test_half_precision_as_close_as_fairseq_lstm_lm(variant, dtype):
    model, d = lm(variant)
    baseline, _ = build("lstm_lm", ["--decoder-embed-dim", 16, "--decoder-hidden-size", 24, "--decoder-layers", 2,
                                    "--dropout", 0], task="language_modeling", dictionary=d)
    tokens = _lm_batch(d)
    precision.assert_low_precision_close(model, lambda m: m(tokens)[0], baseline, lambda m: m(tokens)[0], dtype)


def test_autocast_bf16_forward_backward():
    model, d = lm("fasttrees_conv")
    tokens = _lm_batch(d)
    precision.assert_autocast_backward(model, lambda m: m(tokens)[0])


# --------------------------------------------------------------------------- errors
@pytest.mark.parametrize("extra, message", [
    (["--chunk-size", 5], "--chunk-size 5 must be a positive divisor of --hidden-size 24"),
    (["--hidden-size", 30, "--chunk-size", 3, "--embed-dim", 16], "--chunk-size 3 must be a positive divisor of --embed-dim 16"),
    (["--weight-drop", 1.0], "--weight-drop must be in [0, 1)"),
    (["--num-layers", 0], "--num-layers must be >= 1"),
])
def test_bad_flags_give_clear_errors(extra, message):
    with pytest.raises(ValueError, match=__import__("re").escape(message)):
        build("fasttrees_lstm_lm", [*TINY, *extra], task="language_modeling")


def test_classifier_on_a_language_modelling_task_is_refused():
    from fairseq.tasks.language_modeling import LanguageModelingTask

    from user_dir.models.onlstm import ONLSTMClassifier
    from user_dir.from_flags import parse_cfg

    task = LanguageModelingTask.__new__(LanguageModelingTask)
    cfg = parse_cfg("onlstm_classifier", "sentence_prediction", [*TINY, "--criterion", "sentence_prediction",
                                                                 "--num-classes", 2]).model
    with pytest.raises(ValueError, match="use --task sentence_prediction"):
        ONLSTMClassifier.build_model(cfg, task)


def test_weight_drop_uses_one_mask_per_forward():
    layer = OrderedNeuronsLayer(4, 8, 2, weight_drop=0.5).train()
    calls = []
    orig = F.dropout

    def spy(*args, **kwargs):
        calls.append(args[0].shape)
        return orig(*args, **kwargs)

    F.dropout = spy
    try:
        layer(torch.randn(7, 2, 4))
    finally:
        F.dropout = orig
    assert calls == [layer.weight_hh.shape]  # once for all 7 steps


@pytest.mark.parametrize("arch, task", [("lm_ptb", "language_modeling"), ("classifier_logic", "sentence_prediction")])
def test_fasttrees_and_onlstm_presets_have_equal_size(arch, task):
    """F's default width gives it as many weights as ON-LSTM's master gates (ffn and conv)."""
    extra = ["--criterion", "sentence_prediction", "--num-classes", 3] if task == "sentence_prediction" else []
    sizes = {}
    for name, flags in (("onlstm", []), ("ffn", []), ("conv", ["--master", "conv"])):
        model, _ = build(f"{'onlstm' if name == 'onlstm' else 'fasttrees_lstm'}_{arch}", [*flags, *extra], task=task)
        sizes[name] = sum(p.numel() for p in model.parameters())
    for name in ("ffn", "conv"):
        assert abs(sizes[name] / sizes["onlstm"] - 1) < 1e-3, sizes


# --------------------------------------------------------------------------- truncated BPTT (bptt_lm)
@pytest.mark.parametrize("variant", ["onlstm", "fasttrees_conv"])
def test_stream_segments_continue_the_state_of_the_segment_before(variant):
    """Segments read with stream_pos 0, 1, 2, 3 (bptt_lm) give the outputs of the whole stream read at once; a
    training batch in between does not disturb the evaluation stream; a segment out of order starts from zeros."""
    model, d = lm(variant)
    stream = torch.stack(random_sentences(d, [23, 23], seed=9, bos_eos=False))  # (2, 24)
    with torch.no_grad():
        model.eval()
        whole = model(stream)[0]
        parts = [model(stream[:, i:i + 6], stream_pos=n)[0] for n, i in enumerate(range(0, 18, 6))]
        model.train()  # (dropout is 0 in these models) the training slot starts its own stream
        train_first = model(stream[:, 12:18], stream_pos=0)[0]
        model.eval()
        parts.append(model(stream[:, 18:], stream_pos=3)[0])
        alone = model(stream[:, 6:12])[0]
        skipped = model(stream[:, 6:12], stream_pos=7)[0]  # no state continues position 7
        fresh = model(stream[:, 12:18])[0]
    assert torch.allclose(torch.cat(parts, 1), whole, atol=1e-5)
    assert torch.allclose(train_first, fresh, atol=1e-6)
    assert torch.allclose(skipped, alone, atol=1e-6) and not torch.allclose(alone, whole[:, 6:12], atol=1e-3)


def test_stream_state_round_trips_through_memory_state():
    model, d = lm("fasttrees_conv")
    model.eval()
    stream = torch.stack(random_sentences(d, [11, 11], seed=10, bos_eos=False))
    with torch.no_grad():
        model(stream[:, :6], stream_pos=0)
        saved = model.memory_state("eval")
        expected = model(stream[:, 6:], stream_pos=1)[0]
        model.reset_memory()
        model.load_memory_state(saved, "eval")
        again = model(stream[:, 6:], stream_pos=1)[0]
    assert saved["next_pos"] == 1 and saved["windows"][0] is not None
    assert torch.equal(again, expected)


def test_untie_embeddings_flag():
    tied, _ = build("onlstm_lm", TINY, task="language_modeling")
    untied, d = build("onlstm_lm", [*TINY, "--untie-embeddings"], task="language_modeling")
    assert tied.decoder.tied and tied.decoder.output_projection is None
    assert not untied.decoder.tied and untied.decoder.output_projection.weight.shape == (len(d), 24)
    assert [layer.hidden_size for layer in untied.decoder.encoder.rnn.layers] == [24, 24]
