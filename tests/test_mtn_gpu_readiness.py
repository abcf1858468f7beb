"""MTN on a GPU's terms: half precision, no host sync in the forward pass, activation
checkpointing, and beam search whose incremental state is checked by distinct beams."""
import pytest
import torch
from fairseq.data import data_utils

from tests.helpers import beam, precision
from tests.helpers.cli import fairseq
from tests.helpers.host_sync import count_host_syncs
from tests.helpers.models import build, prev_output, random_sentences
from tests.test_mtn import _dictionary, _model, _session
from tests.test_mtn_cli import TRAIN_ARGS, synthetic  # noqa: F401  (a fixture)
from tests.test_star_transformer_gpu_readiness import (
    CPU_HALF_PRECISION,
    assert_finite_half_precision_losses,
    syncs_while_decoding,
)

BASELINE = ["--encoder-layers", 1, "--decoder-layers", 1, "--encoder-embed-dim", 64, "--decoder-embed-dim", 64,
            "--encoder-ffn-embed-dim", 128, "--decoder-ffn-embed-dim", 128, "--encoder-attention-heads", 2,
            "--decoder-attention-heads", 2, "--dropout", 0]


def _long_batch(d, left_pad=True):
    """Sessions of 121 and 30 tokens (20 and 5 queries) and a one-word session, each with a 120-token target."""
    lengths = [[6, 5, 4, 6, 5, 4, 6, 5, 4, 6, 5, 4, 6, 5, 4, 6, 5, 4, 6, 1], [6, 5, 4, 6, 4], [1]]
    srcs = [_session(d, q, seed) for seed, q in enumerate(lengths)]
    tokens = data_utils.collate_tokens(srcs, d.pad(), left_pad=left_pad)
    tgts = random_sentences(d, [119, 40, 1], seed=11)
    prev = data_utils.collate_tokens([prev_output(t, d.eos()) for t in tgts], d.pad(), left_pad=False)
    return tokens, torch.tensor([len(s) for s in srcs]), prev


@pytest.mark.parametrize("dtype", precision.LOW_PRECISION, ids=["fp16", "bf16"])
@pytest.mark.parametrize("left_pad", [True, False], ids=["left_pad", "right_pad"])
def test_fp16_bf16_close_to_float32_like_fairseq_transformer(dtype, left_pad):
    """.half() / .to(bfloat16), 120-token sessions with sharpened attention, a 1-word session."""
    model, d = _model(extra=("--max-source-positions", 256, "--max-target-positions", 256))
    baseline, _ = build("transformer", BASELINE, dictionary=d)
    assert precision.sharpen_attention(model, 8.0) > 0 and precision.sharpen_attention(baseline, 8.0) > 0
    tokens, lengths, prev = _long_batch(d, left_pad)

    def run(m):
        return m(tokens, lengths, prev)[0]

    precision.assert_low_precision_close(model, run, baseline, run, dtype)


def test_autocast_bf16_forward_backward():
    model, d = _model()
    tokens, lengths, prev = _long_batch(d)
    precision.assert_autocast_backward(model, lambda m: m(tokens, lengths, prev)[0])


def test_no_host_sync_in_training_forward_or_incremental_decoding():
    """With the collater's ``session_layout`` the encoder only gathers; the decoder is fairseq's."""
    model, d = _model()
    tokens, lengths, prev = _long_batch(d)
    layout = model.encoder.layout(tokens)  # what SessionLayoutDataset.collater adds to net_input
    model.train()
    with count_host_syncs() as syncs:
        model(tokens, lengths, prev, session_layout=layout)[0].sum().backward()
    assert not syncs, f"host syncs in the training forward: {list(syncs)}"
    syncs = syncs_while_decoding(model.eval(), prev, src_tokens=tokens, src_lengths=lengths, session_layout=layout)
    assert not syncs, f"host syncs in incremental decoding: {list(syncs)}"
    with count_host_syncs() as syncs:  # the check can fail: without a layout the encoder counts queries
        model.encoder(tokens, lengths)
    assert syncs


def test_layout_from_the_collater_gives_the_same_outputs():
    model, d = _model()
    tokens, lengths, prev = _long_batch(d, left_pad=False)
    with torch.no_grad():
        a = model(tokens, lengths, prev)[0]
        b = model(tokens, lengths, prev, session_layout=model.encoder.layout(tokens))[0]
    assert torch.equal(a, b)


def test_checkpoint_activations_same_loss_and_gradients():
    """--checkpoint-activations wraps every layer in fairseq's checkpoint_wrapper: the layers run
    again in the backward pass, and loss and gradients equal those without (dropout on)."""
    tokens, lengths, prev = _long_batch(_dictionary())
    results = []
    for flag in ((), ("--checkpoint-activations",)):
        model, d = _model(extra=("--dropout", 0.2, *flag))
        model.train()
        calls = []
        layer = model.encoder.levels[0].layers[0]
        layer.fc1.register_forward_hook(lambda *a: calls.append(torch.is_grad_enabled()))
        torch.manual_seed(3)
        logits = model(tokens, lengths, prev)[0]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), prev.reshape(-1))
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}, len(calls)))
    (loss0, grads0, calls0), (loss1, grads1, calls1) = results
    assert calls0 == 1 and calls1 == 2, "with the flag the session layer must be recomputed in backward"
    assert torch.equal(loss0, loss1)
    assert grads0.keys() == grads1.keys()
    for name, g in grads1.items():
        assert torch.allclose(g, grads0[name], atol=1e-6), name


# ----------------------------------------------------------------------------------------------- beam search
def _beam_rows(d):
    srcs = [_session(d, [3, 2, 4], 1), _session(d, [5], 2), _session(d, [1, 6, 2, 3], 3)]
    prevs = [prev_output(t, d.eos()) for t in random_sentences(d, [6, 6, 6], seed=5)]
    return srcs, prevs


@pytest.mark.parametrize("left_pad", [True, False])
def test_beam_reorder_with_distinct_beams(left_pad):
    model, d = _model()
    srcs, prevs = _beam_rows(d)
    beam.assert_beam_reorder(model, srcs, prevs, d.pad(), left_pad_source=left_pad)


@pytest.mark.parametrize("mode", ["noop", "shrink_only"])
def test_beam_reorder_check_catches_a_broken_reorder(mode):
    model, d = _model()
    srcs, prevs = _beam_rows(d)
    beam.assert_broken_reorder_caught(model, mode, srcs, prevs, d.pad())


def test_sequence_generator_scores_equal_teacher_forced_forward():
    model, d = _model()
    srcs, _ = _beam_rows(d)
    sizes = beam.assert_generator_matches_forward(model, d, srcs, beam=4, max_len=8)
    assert sizes, "beam search never reordered its state"


# ------------------------------------------------------------------------------------- through fairseq-train
@CPU_HALF_PRECISION
def test_fp16_fairseq_train_mtn(flags, synthetic, tmp_path):
    """The task's collater adds the session layout; the model trains in float16 with it."""
    out = fairseq("train", synthetic / "bin", "--arch", "mtn_tiny", "--max-update", 5, "--no-save", "--save-dir",
                  tmp_path, *TRAIN_ARGS, "--log-interval", 1, *flags)
    assert_finite_half_precision_losses(out.stdout + out.stderr, 5)


def test_task_collater_adds_the_session_layout(synthetic):
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(synthetic / "bin"), "--task", "query_suggestion", "--arch", "mtn_tiny", "--max-query-length", "12"])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    task.load_dataset("valid")
    data = task.dataset("valid")
    net_input = data.collater([data[i] for i in range(6)])["net_input"]
    model = task.build_model(cfg.model).eval()
    expected = model.encoder.layout(net_input["src_tokens"])
    assert all(torch.equal(net_input["session_layout"][k], v) for k, v in expected.items())
    with torch.no_grad():
        with_layout = model(**net_input)[0]
        net_input.pop("session_layout")
        assert torch.equal(with_layout, model(**net_input)[0])
