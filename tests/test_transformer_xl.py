"""transformer_xl_lm and the bptt_lm task: memory, exactly-once scoring, batching, DDP, bad input."""
from types import SimpleNamespace

import pytest
import torch

from tests.helpers import invariance
from tests.helpers.ddp import assert_ddp_matches_single_process
from tests.helpers.models import build, prev_output, random_sentences, toy_dictionary
from user_dir.tasks.bptt_lm import BPTTLanguageModelingTask, StreamDataset, TokenStream

TINY = ["--n-layer", 2, "--d-model", 16, "--n-head", 2, "--d-head", 8, "--d-inner", 32, "--dropout", 0]


def _model(*extra, dictionary=None):
    model, d = build("transformer_xl_lm", TINY + list(extra), task="language_modeling", dictionary=dictionary)
    return model, d


def _corpus(d, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    body = torch.randint(d.nspecial, len(d), (n,), generator=g)
    return torch.cat([torch.tensor([d.eos()]), body])


def _stream_scores(model, dataset):
    """Per stream, the (target, log-prob) pairs in stream order, running the batches with memory."""
    pad = dataset.pad
    per_stream = [[] for _ in range(dataset.batch_size)]
    with torch.no_grad():
        for i in range(len(dataset)):
            sample = dataset.collater([dataset[i]])
            out = model(**sample["net_input"])
            lp = model.get_normalized_probs(out, log_probs=True)
            tgt = sample["target"]
            scores = lp.gather(-1, tgt.clamp(min=0).unsqueeze(-1)).squeeze(-1)
            for b in range(tgt.size(0)):
                keep = tgt[b].ne(pad)
                per_stream[b] += list(zip(tgt[b][keep].tolist(), scores[b][keep].tolist()))
    return per_stream


@pytest.mark.parametrize("batch_size", [1, 3, 4])
def test_every_token_scored_exactly_once_with_full_context(batch_size):
    """Streaming with memory == scoring every token alone with its whole stream prefix."""
    model, d = _model("--mem-len", 64)
    tokens = _corpus(d, 37)
    ds = StreamDataset(tokens, batch_size, tokens_per_sample=5, pad=d.pad())
    per_stream = _stream_scores(model, ds)
    # every corpus token is a target exactly once, in order
    assert [t for s in per_stream for t, _ in s] == tokens[1:].tolist()
    total = sum(lp for s in per_stream for _, lp in s)
    ref = 0.0
    with torch.no_grad():
        for start, length in zip(ds.starts, ds.lengths):
            for t in range(start, start + length):  # context: the stream from its first source token
                prefix = tokens[start: t + 1].unsqueeze(0)
                lp = model.get_normalized_probs(model(prefix), log_probs=True)[0, -1]
                ref += lp[tokens[t + 1]].item()
    assert abs(total - ref) < 1e-3, (total, ref)


def test_memory_carries_over_and_resets_at_stream_start():
    model, d = _model("--mem-len", 8)
    ds = StreamDataset(_corpus(d, 40), 2, tokens_per_sample=4, pad=d.pad())
    first = _stream_scores(model, ds)
    again = _stream_scores(model, ds)  # stream_pos 0 resets: a second pass is identical
    assert first == again
    # without stream_pos every batch is scored without memory: different from the streamed scores
    with torch.no_grad():
        sample = ds.collater([ds[3]])
        net = dict(sample["net_input"])
        net.pop("stream_pos")
        alone = model(**net)[0]
        for i in range(4):
            s = ds.collater([ds[i]])
            streamed = model(**s["net_input"])
        assert (streamed[0] - alone).abs().max() > 1e-4
        assert streamed[1]["mems"][0].shape == (2, 8, 16)
    # training and evaluation keep separate memories
    model.train()
    model(**ds.collater([ds[0]])["net_input"])
    assert set(model.decoder._stream_mems) == {"train", "eval"}
    model.reset_memory()
    assert model.decoder._stream_mems == {}


def test_data_parallel_workers_get_own_streams_and_equal_batch_counts():
    d = toy_dictionary()
    tokens = _corpus(d, 53)
    ds = StreamDataset(tokens, 2, tokens_per_sample=4, pad=d.pad())
    shards = [ds.for_shard(2, r) for r in range(2)]
    assert len(shards[0]) == len(shards[1])
    starts = list(shards[0].starts) + list(shards[1].starts)
    lengths = list(shards[0].lengths) + list(shards[1].lengths)
    assert starts == sorted(starts) and sum(lengths) == 53 and max(lengths) - min(lengths) <= 1
    covered = []
    for shard in shards:
        for b in range(shard.batch_size):
            covered.append(torch.cat([shard[i]["target"][b] for i in range(len(shard))]))
    got = torch.cat([c[c.ne(d.pad())] for c in covered])
    assert got.tolist() == tokens[1:].tolist()


def test_consecutive_batches_continue_each_stream():
    d = toy_dictionary()
    tokens = _corpus(d, 30)
    ds = StreamDataset(tokens, 3, tokens_per_sample=4, pad=d.pad())
    b0, b1 = ds[0], ds[1]
    for b in range(3):
        assert b1["source"][b, 0] == b0["target"][b, -1]  # next source continues the same stream
        assert torch.equal(b0["source"][b, 1:], b0["target"][b, :-1])


def test_causal_and_incremental_equals_full_with_beam_reorder():
    model, d = _model("--mem-len", 16)
    prev = prev_output(random_sentences(d, [9], seed=3)[0], d.eos())
    invariance.assert_decoder_causal(model, None, prev, d.pad(), len(d))
    invariance.assert_incremental_equals_full(model, None, prev, d.pad())
    sents = [prev_output(s, d.eos()) for s in random_sentences(d, [4, 9, 6], seed=5)]
    invariance.assert_padding_invariant(model, None, sents, d.pad())


def test_incremental_equals_full_adaptive_same_length():
    model, d = _model("--mem-len", 12, "--cutoffs", "10,20", "--div-val", 2, "--untie-r", "--same-length",
                      "--clamp-len", 5, dictionary=toy_dictionary(36))
    prev = prev_output(random_sentences(d, [10], seed=4)[0], d.eos())
    invariance.assert_incremental_equals_full(model, None, prev, d.pad())


def ddp_setup():
    torch.manual_seed(0)
    model, d = _model("--mem-len", 4, "--cutoffs", "10,20", "--div-val", 2, dictionary=toy_dictionary(36))
    model.train()
    ds = StreamDataset(_corpus(d, 60), 2, tokens_per_sample=5, pad=d.pad())
    batches = [ds.collater([ds[i]]) for i in range(2)]

    def loss_fn(m, sample):
        net = dict(sample["net_input"])
        net.pop("stream_pos")  # stateless: the same computation in every process
        out = m(**net)
        inner = getattr(m, "module", m)
        lp = inner.get_normalized_probs(out, log_probs=True)
        return torch.nn.functional.nll_loss(lp.view(-1, lp.size(-1)), sample["target"].view(-1),
                                            ignore_index=d.pad())

    return model, batches, loss_fn


def test_ddp_readiness():
    assert_ddp_matches_single_process("tests.test_transformer_xl:ddp_setup")


def test_memory_is_detached():
    model, d = _model("--mem-len", 6)
    model.train()
    ds = StreamDataset(_corpus(d, 30), 2, tokens_per_sample=4, pad=d.pad())
    for i in range(2):
        out = model(**ds.collater([ds[i]])["net_input"])
        assert all(not m.requires_grad for m in out[1]["mems"])
        out[0].sum().backward()  # a second backward through the memory would fail if it were attached


# ------------------------------------------------------------------ bad input
def test_negative_mem_len_is_rejected():
    with pytest.raises(ValueError, match="--mem-len must be >= 0, got -3"):
        _model("--mem-len", -3)


def test_corpus_too_short_for_the_streams():
    d = toy_dictionary()
    with pytest.raises(ValueError, match=r"too few to fill one batch of 8 streams \(--batch-size 4 x 2"):
        StreamDataset(_corpus(d, 5), 4, tokens_per_sample=3, pad=d.pad(), num_shards=2)


@pytest.mark.parametrize("value", [0, -5])
def test_tokens_per_sample_must_be_positive(value, tmp_path):
    toy_dictionary().save(str(tmp_path / "dict.txt"))
    cfg = SimpleNamespace(data=str(tmp_path), tokens_per_sample=value, batch_size=2, batch_size_valid=None)
    with pytest.raises(ValueError, match=f"--tokens-per-sample must be a positive segment length, got {value}"):
        BPTTLanguageModelingTask.setup_task(cfg)


def test_dictionary_mismatch_with_checkpoint():
    model, _ = _model("--mem-len", 4)
    other, _ = _model("--mem-len", 4, dictionary=toy_dictionary(60))
    other.decoder.dict_path = "/data/other/dict.txt"
    with pytest.raises(ValueError, match=r"vocabulary of 44 symbols, but /data/other/dict.txt has 64"):
        other.load_state_dict(model.state_dict())


def test_cutoffs_must_increase():
    with pytest.raises(ValueError, match="strictly increasing"):
        _model("--cutoffs", "20,10")


def test_cached_key_values_give_the_same_scores():
    """Evaluation reuses the memory's key/value projections and W_kR R: same results as recomputing."""
    for extra in ([], ["--pre-lnorm", "--same-length", "--clamp-len", 3]):
        model, d = _model("--mem-len", 7, *extra)
        ds = StreamDataset(_corpus(d, 60), 2, tokens_per_sample=4, pad=d.pad())
        cached = _stream_scores(model, ds)
        with torch.no_grad():
            mems, recomputed = None, []
            for i in range(len(ds)):
                sample = ds.collater([ds[i]])
                with torch.enable_grad():  # no caching with autograd on
                    hid, mems, kv = model.decoder.extract_features(sample["net_input"]["src_tokens"], mems)
                assert kv is None
                recomputed.append(model.get_normalized_probs((hid.detach(), None), log_probs=True))
        assert model.decoder._stream_mems["eval"]["cache"] is not None
        flat = [lp for s in cached for _, lp in s]
        ref = []
        for b in range(2):
            for i in range(len(ds)):
                tgt = ds[i]["target"][b]
                keep = tgt.ne(d.pad())
                ref += recomputed[i][b][keep].gather(-1, tgt[keep].unsqueeze(-1)).squeeze(-1).tolist()
        assert max(abs(x - y) for x, y in zip(flat, ref)) < 1e-5 and len(flat) == len(ref)


def test_task_iterator_is_ordered_sharded_and_resets_each_epoch(toy_lm_bin):
    cfg = SimpleNamespace(data=toy_lm_bin, tokens_per_sample=8, batch_size=3, batch_size_valid=None)
    task = BPTTLanguageModelingTask.setup_task(cfg)
    task.load_dataset("train")
    ds = task.dataset("train")
    per_worker = []
    for rank in range(2):
        epoch_itr = task.get_batch_iterator(ds, num_shards=2, shard_id=rank, epoch=1)
        first = [s["net_input"]["stream_pos"] for s in epoch_itr.next_epoch_itr(shuffle=True)]
        second = [s["target"] for s in epoch_itr.next_epoch_itr(shuffle=True)]
        assert first == list(range(len(first)))  # in order, never shuffled
        per_worker.append((first, second))
    assert len(per_worker[0][0]) == len(per_worker[1][0])  # same number of batches on every worker
    assert not torch.equal(per_worker[0][1][0], per_worker[1][1][0])  # each worker its own streams
    model, _ = _model("--mem-len", 4, dictionary=task.dictionary)
    model(**ds.collater([ds[0]])["net_input"])
    task.begin_epoch(2, model)
    assert model.decoder._stream_mems == {}
    with pytest.raises(ValueError, match="--context-window is not used"):
        task.eval_lm_dataloader(ds, context_window=5)


def test_stream_read_in_place_equals_the_concatenated_lines(toy_lm_bin):
    """The task reads fairseq-preprocess's memory-mapped .bin in place (no LongTensor copy of the corpus); every
    slice and every batch equal those of the lines concatenated in memory, also after pickling (DataLoader workers)."""
    import os
    import pickle

    from fairseq.data import data_utils

    from user_dir.tasks.bptt_lm import concatenated_lines

    cfg = SimpleNamespace(data=toy_lm_bin, tokens_per_sample=7, batch_size=3, batch_size_valid=None)
    task = BPTTLanguageModelingTask.setup_task(cfg)
    task.load_dataset("train")
    stream = task.dataset("train").tokens
    assert isinstance(stream, TokenStream)
    data = data_utils.load_indexed_dataset(os.path.join(toy_lm_bin, "train"), task.dictionary)
    concat = concatenated_lines(data, task.dictionary.eos())
    assert concat.numel() == 1 + sum(len(data[i]) for i in range(len(data)))
    n = concat.numel()
    assert stream.numel() == n and stream.max_id() == int(concat.max())
    for a, b in [(0, 0), (0, 1), (0, 5), (1, 9), (n - 3, n), (n - 1, n + 4), (5, 2), (0, n)]:
        assert torch.equal(stream[a:b], concat[a:b]), (a, b)
        assert stream[a:b].dtype == torch.long
    for shard in range(2):
        mapped = task.dataset("train").for_shard(2, shard)
        in_memory = StreamDataset(concat, 3, 7, pad=task.dictionary.pad(), num_shards=2, shard_id=shard)
        assert len(mapped) == len(in_memory)
        for i in range(len(mapped)):
            assert torch.equal(mapped[i]["source"], in_memory[i]["source"])
            assert torch.equal(mapped[i]["target"], in_memory[i]["target"])
    assert torch.equal(pickle.loads(pickle.dumps(stream))[0:n], concat)


@pytest.mark.parametrize("name", ["wt103_base", "wt103_large", "enwik8_base", "enwik8_large", "ptb_small"])
def test_hydra_yaml_matches_the_configs(name):
    """Every YAML's model section is a valid TransformerXLConfig and names the registered model/task."""
    import os

    from omegaconf import OmegaConf

    from tests.helpers.cli import ROOT
    from user_dir.models.transformer_xl_lm import TransformerXLConfig

    cfg = OmegaConf.load(os.path.join(ROOT, "examples", "transformer_xl", f"{name}.yaml"))
    assert cfg.model._name == "transformer_xl_lm" and cfg.task._name == "bptt_lm"
    model = OmegaConf.merge(OmegaConf.structured(TransformerXLConfig),
                            {k: v for k, v in cfg.model.items() if k != "_name"})
    from argparse import Namespace

    from fairseq.models import ARCH_CONFIG_REGISTRY

    preset = Namespace()
    ARCH_CONFIG_REGISTRY["transformer_xl_lm_" + name](preset)  # what the CLI preset sets
    for key, value in vars(preset).items():
        assert model[key] == value, key  # YAML == arch preset


def test_copy_free_rel_shift_equals_the_reference_shift():
    """The copy-free shift used by the attention gives the reference ``_rel_shift``'s values and gradients."""
    from user_dir.modules.relative_multihead_attention import rel_shift, shifted_position_scores
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(3)
    for B, H, T, K in [(2, 3, 5, 9), (1, 1, 4, 4), (3, 2, 7, 20)]:
        q = torch.randn(B, H, T, 6, generator=g, dtype=torch.float64, requires_grad=True)
        r = torch.randn(H, 6, K, generator=g, dtype=torch.float64, requires_grad=True)
        ref, ours = rel_shift(torch.matmul(q, r)), shifted_position_scores(q, F.pad(r, (1, 0)).transpose(-1, -2))
        assert torch.allclose(ref, ours, atol=1e-12)  # junk entries above the diagonal included
        w = torch.randn(ref.shape, generator=g, dtype=torch.float64)
        for a, b in zip(torch.autograd.grad((ref * w).sum(), (q, r)), torch.autograd.grad((ours * w).sum(), (q, r))):
            assert torch.allclose(a, b, atol=1e-12)


@pytest.mark.parametrize("pre_norm", [False, True])
def test_training_attention_path_equals_the_fused_kernel(pre_norm):
    """With autograd on, the attention is written out (``_attend``); without, it runs
    ``scaled_dot_product_attention``: both give the same outputs for the same memory and mask."""
    from user_dir.modules.relative_multihead_attention import (RelativeMultiheadAttention, RelativeSinusoid,
                                                                attention_mask, hidden_key_columns)

    torch.manual_seed(2)
    attn = RelativeMultiheadAttention(16, 2, 8, pre_norm=pre_norm).eval()
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0.0, 0.3)
    h, memory = torch.randn(3, 5, 16), torch.randn(3, 4, 16)
    r = RelativeSinusoid(16)(9)
    mask = attention_mask(5, 4, 4, same_length=True)
    with_grad, _, _ = attn(h.requires_grad_(), r, mask, memory)
    with torch.no_grad():
        fused, _, _ = attn(h, r, mask, memory)
        fused_columns, _, _ = attn(h, r, mask, memory, mask_columns=hidden_key_columns(5, 4, 4, True))
    assert torch.allclose(with_grad, fused, atol=1e-5)
    assert torch.allclose(with_grad, fused_columns, atol=1e-5)  # the mask written into its columns only


# ------------------------------------------------------------------ beam search
def _beam_model():
    return _model("--mem-len", 32, "--cutoffs", "10,20", "--div-val", 2, "--init-std", 0.3,
                  dictionary=toy_dictionary(36))


def _distinct_prefixes(d, n=3, length=8):
    return [prev_output(s, d.eos()) for s in random_sentences(d, [length - 1] * n, seed=11)]


def test_beam_reorder_with_distinct_rows_and_a_shrinking_batch():
    """Incremental decoding (memory and evaluation caches in the incremental state) with beam-search
    reorders -- rows permuted, one duplicated, then the batch shrunk -- equals full forward passes."""
    from tests.helpers.beam import assert_beam_reorder

    model, d = _beam_model()
    assert_beam_reorder(model, None, _distinct_prefixes(d), d.pad())


@pytest.mark.parametrize("mode", ["noop", "shrink_only"])
def test_beam_reorder_check_fails_when_reordering_is_broken(mode):
    from tests.helpers.beam import assert_beam_reorder, broken_reorder

    model, d = _beam_model()
    with broken_reorder(model, mode), pytest.raises((AssertionError, RuntimeError)):
        assert_beam_reorder(model, None, _distinct_prefixes(d), d.pad())


def test_sequence_generator_scores_equal_teacher_forced_forward():
    """fairseq's SequenceGenerator (beam 4) on prompts of different lengths (right-padded prefixes,
    as fairseq forces them): every hypothesis' positional scores == a teacher-forced forward."""
    from tests.helpers.beam import assert_generator_matches_forward

    model, d = _beam_model()
    prompts = random_sentences(d, [5, 2, 4], seed=12, bos_eos=False)
    width = max(len(p) for p in prompts)
    prefixes = [torch.cat([p, torch.full((width - len(p),), d.pad())]) for p in prompts]
    sizes = assert_generator_matches_forward(model, d, beam=4, max_len=8, prefix_list=prefixes, atol=1e-5)
    assert sizes  # (the generator reordered the incremental state)


def test_hidden_key_columns_hold_every_hidden_key():
    """Evaluation masks only the columns ``hidden_key_columns`` names: every hidden key of ``attention_mask``
    must be in them, for segments, memories and windows of every relative size."""
    from user_dir.modules.relative_multihead_attention import attention_mask, hidden_key_columns

    for qlen in (1, 3, 8):
        for mlen in (0, 1, 5, 8, 12):
            for mem_len in (0, 4, 8, 12):
                for same_length in (False, True):
                    mask = attention_mask(qlen, mlen, mem_len, same_length)
                    a, b = hidden_key_columns(qlen, mlen, mem_len, same_length)
                    assert 0 <= a <= b <= mlen + qlen
                    assert not mask[:, a:b].any(), (qlen, mlen, mem_len, same_length, a, b)
                    if same_length and mem_len and mlen + qlen > mem_len:
                        assert a > 0  # the window hides the oldest keys: a real split, not the whole width
