"""MTN model: batching invariance, incremental decoding, no leakage across queries, DDP, metrics, bad input."""
import pytest
import torch

from tests.helpers import beam, invariance
from tests.helpers.ddp import assert_ddp_matches_single_process
from tests.helpers.models import build, prev_output, random_sentences, toy_dictionary
from user_dir.modules import mtn_session_encoder as mse
from user_dir.modules import query_suggestion_metrics as qm
from user_dir.modules.query_sessions import SEP, SessionError, parse_session_line, read_sessions, session_examples

TINY = ["--dropout", 0, "--max-query-length", 6]


def _dictionary():
    d = toy_dictionary(40)
    d.add_symbol(SEP)
    return d


def _model(arch="mtn_tiny", extra=()):
    return build(arch, [*TINY, *extra], task="query_suggestion", dictionary=_dictionary())


def _session(d, lengths, seed):
    """A flattened session row: q_1 </q> q_2 </q> … q_m <eos>."""
    g = torch.Generator().manual_seed(seed)
    sep, toks = d.index(SEP), []
    for i, n in enumerate(lengths):
        toks += torch.randint(d.nspecial, len(d) - 1, (n,), generator=g).tolist()
        toks.append(sep if i < len(lengths) - 1 else d.eos())
    return torch.tensor(toks)


@pytest.mark.parametrize("arch,extra", [("mtn_tiny", ()), ("mtn_tiny", ("--levels", 3, "--share-all-embeddings")),
                                        ("mtn_tiny", ("--encoder-normalize-before", "--decoder-normalize-before"))])
def test_padding_causality_incremental(arch, extra):
    model, d = _model(arch, extra)
    srcs = [_session(d, [3, 2, 4], 1), _session(d, [5], 2), _session(d, [1, 6, 2, 3], 3)]
    tgts = [prev_output(t, d.eos()) for t in random_sentences(d, [3, 5, 2], seed=5)]
    invariance.assert_padding_invariant(model, srcs, tgts, d.pad(), left_pad_source=True)
    invariance.assert_padding_invariant(model, srcs, tgts, d.pad(), left_pad_source=False)
    invariance.assert_decoder_causal(model, srcs[0], tgts[1], d.pad(), len(d))
    same_length = [prev_output(t, d.eos()) for t in random_sentences(d, [4, 4, 4], seed=6)]
    beam.assert_beam_reorder(model, srcs, same_length, d.pad())  # distinct beams, reordered and shrunk


def _encode(model, src):
    with torch.no_grad():
        return model.encoder(src.unsqueeze(0), torch.tensor([len(src)]))["encoder_out"][0][:, 0]


def _assert_no_leak(model, d):
    """Changing (and lengthening) the last query leaves every earlier query's representations unchanged."""
    base = _session(d, [3, 2, 4, 2], 7)
    changed = torch.cat([base[:-3], _session(d, [5], 99)])  # new last query, 5 words instead of 2
    prefix = len(base) - 3  # q_1..q_3 with their separators
    a, b = _encode(model, base), _encode(model, changed)
    diff = (a[:prefix] - b[:prefix]).abs().max().item()
    assert diff <= 1e-5, f"earlier queries changed by {diff:.3g} when a later query changed"
    assert (a[prefix:prefix + 2] - b[prefix:prefix + 2]).abs().max() > 1e-3  # the changed query itself did change


@pytest.mark.parametrize("levels", [2, 3])
def test_no_leakage_from_later_queries(levels):
    model, d = _model(extra=("--levels", levels, "--session-layers", 2))
    _assert_no_leak(model, d)


def test_leak_check_fails_without_the_session_mask(monkeypatch):
    model, d = _model()
    monkeypatch.setattr(mse, "causal_mask", lambda n, device: torch.zeros(n, n, dtype=torch.bool, device=device))
    with pytest.raises(AssertionError, match="earlier queries changed"):
        _assert_no_leak(model, d)


def test_session_context_reaches_the_decoder():
    """The first query influences the decoder through the session level (not only through cross-attention)."""
    model, d = _model()
    src = _session(d, [3, 2], 1)
    other = src.clone()
    other[0] = (other[0] - d.nspecial + 1) % (len(d) - 1 - d.nspecial) + d.nspecial
    prev = [prev_output(random_sentences(d, [4], seed=3)[0], d.eos())]
    a = invariance.decoder_logits(model, [src], prev, d.pad())
    b = invariance.decoder_logits(model, [other], prev, d.pad())
    assert (a - b).abs().max() > 1e-4
    q2_a, q2_b = _encode(model, src)[4:], _encode(model, other)[4:]  # tokens of q_2: changed via s_1 -> s_2 only
    assert (q2_a - q2_b).abs().max() > 1e-4


def test_split_queries_layout():
    d = _dictionary()
    sep = d.index(SEP)
    w = [d.index(f"w{i}") for i in range(4)]
    src = torch.tensor([[d.pad(), w[0], w[1], sep, w[2], d.eos()], [w[3], sep, w[0], sep, w[1], d.eos()]])
    lay = mse.split_queries(src, d.pad(), d.eos(), sep, slots=4)
    assert lay["n_queries"].tolist() == [2, 3]
    assert lay["pos"][0, 1:].tolist() == [0, 1, 2, 0, 1]
    assert lay["qid"][1].tolist() == [2, 2, 3, 3, 4, 4]
    assert lay["q_index"].tolist() == [0, 1, 0, 1, 2]


@pytest.mark.parametrize("row,message", [(["w1", SEP, SEP, "w2"], "empty query"),
                                         ([SEP, "w1"], "empty query"),
                                         (["w1"] * 7, "more than --max-query-length 6")])
def test_encoder_rejects_bad_rows(row, message):
    model, d = _model()
    src = torch.tensor([[d.index(w) for w in row] + [d.eos()]])
    with pytest.raises(mse.SessionInputError, match=message):
        model.encoder(src, torch.tensor([src.size(1)]))


def test_model_needs_separator_in_dictionary():
    with pytest.raises(ValueError, match="no query separator"):
        build("mtn_tiny", TINY, task="query_suggestion", dictionary=toy_dictionary(10))


def ddp_setup():
    torch.manual_seed(0)
    model, d = _model(extra=("--levels", 3))
    model.train()
    batches = []
    for seed in (1, 2):
        src = [_session(d, [2, 3], seed), _session(d, [1, 1, 2], seed + 5)]
        src_tokens = torch.nn.utils.rnn.pad_sequence(src, batch_first=True, padding_value=d.pad())
        tgt = torch.stack(random_sentences(d, [4, 4], seed=seed + 10))
        prev = torch.stack([prev_output(t, d.eos()) for t in tgt])
        batches.append((src_tokens, torch.tensor([len(s) for s in src]), prev, tgt))

    def loss_fn(m, batch):
        src, lengths, prev, target = batch
        logits = m(src, lengths, prev)[0]
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1))

    return model, batches, loss_fn


def test_ddp_matches_single_process():
    assert_ddp_matches_single_process("tests.test_mtn:ddp_setup")


# --- metrics, checked by hand -------------------------------------------------------------------

def test_rank_metrics_hand_checked():
    refs = ["cheap flights", "new york hotels", "weather"]
    nbest = [["cheap flight", "cheap flights", "flights"],  # rank 2
             ["new york  hotels", "ny hotels", "hotels"],    # rank 1 (whitespace normalised)
             ["weather today", "forecast", "rain"]]          # absent
    s = qm.score(refs, nbest, ks=(1, 3))
    assert s["em@1"] == pytest.approx(100 / 3)
    assert s["em@3"] == pytest.approx(200 / 3)
    assert s["mrr"] == pytest.approx(100 * (1 / 2 + 1 + 0) / 3)
    assert s["n"] == 3


def test_bleu_hand_checked():
    assert qm.bleu(["a b c d"], ["a b c d"]).score == pytest.approx(100.0)
    b = qm.bleu(["a b c d e"], ["a b c d f"])  # unigram 4/5, bigram 3/4, trigram 2/3, 4-gram 1/2, no brevity penalty
    assert b.counts[:4] == [4, 3, 2, 1] and b.totals[:4] == [5, 4, 3, 2]
    assert b.score == pytest.approx(100 * (4 / 5 * 3 / 4 * 2 / 3 * 1 / 2) ** 0.25, abs=1e-6)


# --- session format ---------------------------------------------------------------------------

def test_session_examples_never_see_later_queries():
    queries = [["a"], ["b", "c"], ["d"], ["e"]]
    ex = session_examples(queries)
    assert ex == [([["a"]], ["b", "c"]), ([["a"], ["b", "c"]], ["d"]), ([["a"], ["b", "c"], ["d"]], ["e"])]
    assert session_examples(queries, max_context=1)[2] == ([["d"]], ["e"])


@pytest.mark.parametrize("line,message", [("only one query", "single query"), ("a\t\tb", "empty query"),
                                          ("a\tb \t", "empty query"), ("a b c d\tx", "has 4 words, more than"),
                                          (f"a {SEP}\tb", "reserved query separator")])
def test_bad_sessions_are_named(line, message):
    with pytest.raises(SessionError, match=f"f.ses:7: .*{message}"):
        parse_session_line(line, "f.ses:7", max_query_length=3)


def test_bad_sessions_skipped_and_counted(tmp_path):
    path = tmp_path / "s.ses"
    path.write_text("a b\tc\nsolo\n\nx\t\ty\nq\tr\ts\n")
    sessions, skipped = read_sessions(str(path), max_query_length=5, on_bad="skip")
    assert sessions == [[["a", "b"], ["c"]], [["q"], ["r"], ["s"]]]
    assert skipped == {"single-query session": 1, "empty query": 1}
