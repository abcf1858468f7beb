"""Task ``bptt_lm``: truncated back-propagation through time over contiguous streams.

The training recipe of Transformer-XL (official ``data_utils.py``, ``LMOrderedIterator``), written as a
fairseq task: the split is one token stream cut into ``S`` contiguous streams; batch ``i`` holds positions
``[i·T, (i+1)·T)`` of each of a worker's streams (``T = --tokens-per-sample``), so consecutive batches
continue every stream and nothing is shuffled.  A model with memory (``transformer_xl_lm``; also the
recurrent ``onlstm_lm`` / ``fasttrees_lstm_lm``) carries its state from one batch to the next
(:class:`StreamMemoryModel`; what the model does with it: :mod:`user_dir.models.transformer_xl_lm`).

Reconstruction decisions
------------------------
1. *Stream split, nothing trimmed.*  The split's lines, each ending in ``</s>``, are concatenated with one
   ``</s>`` in front as the first context, so every token of the corpus is a target exactly once.  The
   targets are cut into ``S = batch_size × data-parallel world size`` streams whose lengths differ by at most
   one token; worker ``r`` owns streams ``[r·batch_size, (r+1)·batch_size)``; a stream that has run out is
   padded at the end (pad targets are ignored by the criteria); every worker gets the same number of
   batches.  (The official iterator trims the remainder; fairseq's ``truncated_bptt_lm`` never predicts the
   first token of each block.)
2. *Stream read in place.*  A split binarized by ``fairseq-preprocess`` is read where it lies, from the
   memory-mapped ``.bin`` (:class:`TokenStream`), each batch's slices turned into LongTensors as they are
   read, instead of every line concatenated into one LongTensor (8 bytes a token, in every worker).  Shards
   combined from ``train1``... or other ``--dataset-impl`` values are concatenated in memory
   (:func:`token_stream`).
3. *Stream position.*  Each batch carries ``net_input["stream_pos"] = i`` when the model has a memory
   (``reset_memory``); a model without one (``fasttrees_transformer_lm``, fairseq's ``transformer_lm``) gets
   batches without the key and reads each segment on its own.
4. *Memory resets and resuming.*  ``begin_epoch`` resets the model's memories, ``begin_valid_epoch`` only the
   evaluation memory (validation may come mid-epoch).  The training memory is saved with each checkpoint and
   restored when training resumes mid-epoch (:meth:`BPTTLanguageModelingTask.get_checkpoint_dict`).
5. *Generation.*  Each prompt is continued from ``</s>`` with the prompt forced as a prefix, so it enters the
   memory token by token; ``--max-len-b`` counts the tokens generated after the prompt (``--max-len-a`` is
   raised to 1 during generation).  ``fairseq-generate`` over a binarized split uses each stream block as a
   prompt; blocks contain ``</s>``, which fairseq's beam prefix handling rejects, so use ``--beam 1`` there.
6. *No* ``--context-window``: the model's memory provides the context (an error says so).

``fairseq-eval-lm --task bptt_lm --tokens-per-sample 64 --batch-size 1
--model-overrides '{"mem_len":640,"clamp_len":400,"same_length":True}'``
scores the test set with a longer memory than training used.
"""
import functools
import logging
import math
import os
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

from fairseq import utils
from fairseq.data import Dictionary, FairseqDataset, data_utils, iterators
from fairseq.data.indexed_dataset import MMapIndexedDataset
from fairseq.dataclass import FairseqDataclass
from fairseq.tasks import FairseqTask, register_task
from omegaconf import II

logger = logging.getLogger(__name__)



class StreamMemoryModel:
    """What ``bptt_lm`` asks of a language model that carries state across the batches of a stream
    (``reset_memory``, ``memory_state``, ``load_memory_state``), handed to its decoder, which keeps the state."""

    def reset_memory(self, slot=None):
        self.decoder.reset_memory(slot)

    def memory_state(self, slot="train"):
        return self.decoder.memory_state(slot)

    def load_memory_state(self, saved, slot="train"):
        self.decoder.load_memory_state(saved, slot)

@dataclass
class BPTTLMConfig(FairseqDataclass):
    data: str = field(default="???", metadata={"help": "path to data directory (fairseq-preprocess output)"})
    tokens_per_sample: int = field(default=70, metadata={"help": "segment length T of truncated BPTT"})
    batch_size: Optional[int] = II("dataset.batch_size")
    batch_size_valid: Optional[int] = II("dataset.batch_size_valid")
    max_target_positions: Optional[int] = field(default=None, metadata={"help": "unused (the memory is unbounded)"})


class TokenStream:
    """``[</s>] + corpus`` of a split binarized by ``fairseq-preprocess`` (``--dataset-impl mmap``, its
    default), read in place from the memory-mapped ``.bin``: no copy of the corpus in memory
    (WikiText-103's 103M tokens would take 824 MB per worker as a LongTensor); the file's own
    2- or 4-byte ids stay in the page cache, which the workers of a machine share.  ``stream[a:b]``
    is a LongTensor; :func:`token_stream` decides when it applies."""

    def __init__(self, data: MMapIndexedDataset, eos: int):
        self.data, self.eos = data, eos
        self.length = 1 + int(data.sizes.sum(dtype=np.int64))

    def _corpus(self) -> np.ndarray:
        index = self.data._index
        offset = int(index._pointers[0]) if len(index) else 0
        return np.frombuffer(self.data._bin_buffer, dtype=index.dtype, count=self.length - 1, offset=offset)

    def numel(self) -> int:
        return self.length

    def max_id(self) -> int:
        return int(self._corpus().max()) if self.length > 1 else self.eos

    def __getitem__(self, span: slice) -> torch.Tensor:
        start, stop, _ = span.indices(self.length)
        stop = max(start, stop)
        part = self._corpus()[max(start - 1, 0):max(stop - 1, 0)].astype(np.int64)
        if start == 0 and stop > 0:
            part = np.concatenate([np.array([self.eos], dtype=np.int64), part])
        return torch.from_numpy(part)


def token_stream(data, eos: int):
    """The split as one stream ``[</s>] + corpus`` (module docstring): a :class:`TokenStream` over the
    memory-mapped file when its lines lie back to back in it (as ``fairseq-preprocess`` writes them),
    otherwise (other ``--dataset-impl``, ``train1``... shards combined) the lines concatenated in memory."""
    if isinstance(data, MMapIndexedDataset) and hasattr(data, "_index") and hasattr(data, "_bin_buffer"):
        index = data._index
        sizes, pointers = np.asarray(index.sizes, dtype=np.int64), np.asarray(index._pointers, dtype=np.int64)
        if np.array_equal(pointers[1:], pointers[:-1] + sizes[:-1] * np.dtype(index.dtype).itemsize):
            return TokenStream(data, eos)
    return concatenated_lines(data, eos)


def concatenated_lines(data, eos: int) -> torch.Tensor:
    """``[</s>] + corpus`` as one LongTensor, line by line (any indexed dataset)."""
    return torch.cat([torch.tensor([eos], dtype=torch.long)] + [data[i].long() for i in range(len(data))])


def max_token_id(tokens) -> int:
    return tokens.max_id() if isinstance(tokens, TokenStream) else int(tokens.max())


class StreamDataset(FairseqDataset):
    """A token stream cut into contiguous streams; item ``i`` is batch ``i`` of one worker.

    ``tokens`` is ``[</s>] + corpus`` (a LongTensor or a :class:`TokenStream`): target position
    ``t`` is ``tokens[t+1]``, predicted from ``tokens[:t+1]``.
    """

    def __init__(self, tokens, batch_size, tokens_per_sample, pad, source="corpus", num_shards=1, shard_id=0):
        super().__init__()
        self.tokens, self.pad, self.source = tokens, pad, source
        self.batch_size, self.tokens_per_sample = batch_size, tokens_per_sample
        self.num_shards, self.shard_id = num_shards, shard_id
        n_targets = tokens.numel() - 1
        n_streams = batch_size * num_shards
        if n_targets < n_streams:
            raise ValueError(
                f"{source}: {n_targets} tokens are too few to fill one batch of {n_streams} streams "
                f"(--batch-size {batch_size} x {num_shards} data-parallel workers); use a smaller --batch-size")
        base, extra = divmod(n_targets, n_streams)
        lengths = np.array([base + (1 if s < extra else 0) for s in range(n_streams)])
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        mine = slice(shard_id * batch_size, (shard_id + 1) * batch_size)
        self.starts, self.lengths = starts[mine], lengths[mine]
        # the same count on every worker: set by the longest stream of all
        self.n_batches = math.ceil(lengths.max() / tokens_per_sample)

    def for_shard(self, num_shards, shard_id):
        """The same stream split among ``num_shards`` data-parallel workers; worker ``shard_id``'s part."""
        if num_shards == self.num_shards and shard_id == self.shard_id:
            return self
        return StreamDataset(self.tokens, self.batch_size, self.tokens_per_sample, self.pad, self.source,
                             num_shards, shard_id)

    def __len__(self):
        return self.n_batches

    def __getitem__(self, i):
        T = self.tokens_per_sample
        width = min(T, int(max(self.lengths.max() - i * T, 0))) or 1
        src = torch.full((self.batch_size, width), self.pad, dtype=torch.long)
        tgt = torch.full((self.batch_size, width), self.pad, dtype=torch.long)
        for b, (start, length) in enumerate(zip(self.starts, self.lengths)):
            lo, hi = i * T, min((i + 1) * T, int(length))
            if hi > lo:
                src[b, : hi - lo] = self.tokens[start + lo: start + hi]
                tgt[b, : hi - lo] = self.tokens[start + lo + 1: start + hi + 1]
        return {"id": i, "source": src, "target": tgt}

    def collater(self, samples, stream_pos=True):
        """The batch; ``net_input["stream_pos"]`` only with ``stream_pos`` (for a model with memory)."""
        assert len(samples) == 1, "every item of a StreamDataset is a whole batch"
        item = samples[0]
        src, tgt = item["source"], item["target"]
        net_input = {"src_tokens": src, "src_lengths": src.ne(self.pad).sum(1)}
        if stream_pos:
            net_input["stream_pos"] = item["id"]
        return {
            "id": torch.full((src.size(0),), item["id"], dtype=torch.long),
            "nsentences": src.size(0),
            "ntokens": int(tgt.ne(self.pad).sum()),
            "net_input": net_input,
            "target": tgt,
        }

    def num_tokens(self, index):
        return self.batch_size * self.tokens_per_sample

    def size(self, index):
        return self.tokens_per_sample

    def ordered_indices(self):
        return np.arange(len(self))

    @property
    def supports_prefetch(self):
        return False


class PromptDataset(FairseqDataset):
    """Sentences for generation and scoring (hub ``sample()``/``score()``, ``fairseq-interactive``).

    As ``language_modeling``'s: the source is ``</s>`` + the sentence (without a final ``</s>``),
    the target the sentence + ``</s>``, both right-padded; generation forces the source
    (after its ``</s>``) as a prefix, scoring (``SequenceScorer``) scores the target."""

    def __init__(self, prompts, pad, eos):
        self.prompts = [p[:-1] if len(p) > 0 and p[-1] == eos else p for p in prompts]
        self.sizes = np.array([len(p) + 1 for p in self.prompts])
        self.pad, self.eos = pad, eos

    def __getitem__(self, i):
        p, eos = self.prompts[i], torch.tensor([self.eos], dtype=torch.long)
        return {"id": i, "source": torch.cat([eos, p.long()]), "target": torch.cat([p.long(), eos])}

    def __len__(self):
        return len(self.prompts)

    def collater(self, samples):
        if not samples:
            return {}
        src = data_utils.collate_tokens([s["source"] for s in samples], self.pad, left_pad=False)
        tgt = data_utils.collate_tokens([s["target"] for s in samples], self.pad, left_pad=False)
        return {"id": torch.tensor([s["id"] for s in samples]), "nsentences": len(samples),
                "ntokens": int(tgt.ne(self.pad).sum()),
                "net_input": {"src_tokens": src, "src_lengths": src.ne(self.pad).sum(1)}, "target": tgt}

    def num_tokens(self, index):
        return int(self.sizes[index])

    def size(self, index):
        return int(self.sizes[index])


@register_task("bptt_lm", dataclass=BPTTLMConfig)
class BPTTLanguageModelingTask(FairseqTask):
    """Language modelling over contiguous streams with memory carried across batches (see module docstring)."""

    model_has_memory = True  # batches carry stream_pos; build_model looks at the model

    def __init__(self, cfg, dictionary):
        super().__init__(cfg)
        self.dictionary = dictionary

    @classmethod
    def setup_task(cls, cfg, **kwargs):
        if cfg.tokens_per_sample is None or cfg.tokens_per_sample <= 0:
            raise ValueError(f"--tokens-per-sample must be a positive segment length, got {cfg.tokens_per_sample}")
        paths = utils.split_paths(cfg.data)
        if not paths:
            raise ValueError("bptt_lm needs a data directory")
        dict_path = os.path.join(paths[0], "dict.txt")
        if not os.path.exists(dict_path):
            raise FileNotFoundError(f"bptt_lm: dictionary {dict_path} not found (run fairseq-preprocess "
                                    f"--only-source first)")
        dictionary = Dictionary.load(dict_path)
        logger.info(f"dictionary {dict_path}: {len(dictionary)} types")
        return cls(cfg, dictionary)

    def _batch_size(self, split):
        size = self.cfg.batch_size if split == "train" else (self.cfg.batch_size_valid or self.cfg.batch_size)
        if size is None or size <= 0:
            raise ValueError(f"bptt_lm: --batch-size (the number of parallel streams) must be given and > 0, "
                             f"got {size}")
        return size

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        paths = utils.split_paths(self.cfg.data)
        split_path = os.path.join(paths[(epoch - 1) % len(paths)], split)
        data = data_utils.load_indexed_dataset(split_path, self.dictionary, combine=combine)
        if data is None:
            raise FileNotFoundError(f"bptt_lm: dataset {split} not found at {split_path}.{{bin,idx}}")
        tokens = token_stream(data, self.dictionary.eos())
        top = max_token_id(tokens)
        if top >= len(self.dictionary):
            raise ValueError(f"{split_path}.bin holds token id {top}, but the dictionary has only "
                             f"{len(self.dictionary)} symbols: the data was binarized with another dictionary")
        self.datasets[split] = StreamDataset(tokens, self._batch_size(split), self.cfg.tokens_per_sample,
                                             self.dictionary.pad(), source=f"{split_path}.bin")
        logger.info(f"{split}: {tokens.numel() - 1} tokens, {self.datasets[split].batch_size} streams, "
                    f"{len(self.datasets[split])} batches of {self.cfg.tokens_per_sample}")

    def get_batch_iterator(self, dataset, max_tokens=None, max_sentences=None, max_positions=None,
                           ignore_invalid_inputs=False, required_batch_size_multiple=1, seed=1, num_shards=1,
                           shard_id=0, num_workers=0, epoch=1, data_buffer_size=0, disable_iterator_cache=False,
                           skip_remainder_batch=False, grouped_shuffling=False, update_epoch_batch_itr=False,
                           **kwargs):
        if not isinstance(dataset, StreamDataset):  # prompts for generation: ordinary batching
            return super().get_batch_iterator(
                dataset, max_tokens=max_tokens, max_sentences=max_sentences, max_positions=None,
                ignore_invalid_inputs=ignore_invalid_inputs, required_batch_size_multiple=required_batch_size_multiple,
                seed=seed, num_shards=num_shards, shard_id=shard_id, num_workers=num_workers, epoch=epoch,
                data_buffer_size=data_buffer_size, disable_iterator_cache=True)
        shard = dataset.for_shard(num_shards, shard_id)
        self._shard = (num_shards, shard_id)
        return iterators.EpochBatchIterator(
            dataset=shard, collate_fn=functools.partial(shard.collater, stream_pos=self.model_has_memory),
            batch_sampler=[[i] for i in range(len(shard))],
            seed=seed, num_workers=num_workers, epoch=epoch, buffer_size=data_buffer_size,
            disable_shuffling=True, skip_remainder_batch=False,
        )

    def eval_lm_dataloader(self, dataset, max_tokens=36000, batch_size=None, max_positions=None, num_shards=1,
                           shard_id=0, num_workers=1, data_buffer_size=10, context_window=0):
        if context_window > 0:
            raise ValueError("bptt_lm: --context-window is not used; the model's memory provides the context "
                             "(e.g. --model-overrides '{\"mem_len\": 640}')")
        return self.get_batch_iterator(dataset, num_shards=num_shards, shard_id=shard_id, num_workers=num_workers,
                                       data_buffer_size=data_buffer_size).next_epoch_itr(shuffle=False)

    def build_model(self, cfg, from_checkpoint=False):
        """fairseq's; notes whether the model keeps a memory: a model without one (fairseq's decoders do
        not take ``stream_pos``) gets its batches without the key (:meth:`get_batch_iterator`)."""
        model = super().build_model(cfg, from_checkpoint)
        self.model_has_memory = hasattr(model, "reset_memory")
        self._model = model
        return model

    def _reset_memory(self, model, slot=None):
        inner = getattr(model, "module", model)  # unwrap DDP
        if hasattr(inner, "reset_memory"):
            inner.reset_memory(slot)

    # ------------------------------------------------------------ resuming
    # fairseq keeps ``get_checkpoint_dict()`` in every checkpoint's extra state and hands it back to
    # ``set_checkpoint_dict`` when training resumes.  The training memory goes there, with the data-parallel
    # worker whose streams it continues: a run resumed mid-epoch reads its next segment with the memory an
    # uninterrupted run would have (``fairseq-train`` saves on worker 0 only, so the other workers of a
    # data-parallel run resume their streams without memory, with a warning).

    def get_checkpoint_dict(self):
        model = getattr(self, "_model", None)
        memory = model.memory_state() if hasattr(model, "memory_state") else None
        return {self.__class__.__name__: {"train_memory": memory, "shard": getattr(self, "_shard", (1, 0))}}

    def set_checkpoint_dict(self, state):
        memory, shard = state.get("train_memory"), tuple(state.get("shard", (1, 0)))
        if memory is not None and shard != getattr(self, "_shard", (1, 0)):
            logger.warning(f"bptt_lm: the checkpoint's training memory belongs to worker {shard[1]} of {shard[0]}; "
                           f"this worker resumes its streams without memory")
            memory = None
        self._resumed_memory = memory  # restored by begin_epoch, which fairseq calls after loading

    def begin_epoch(self, epoch, model):
        self._reset_memory(model)
        memory, self._resumed_memory = getattr(self, "_resumed_memory", None), None
        inner = getattr(model, "module", model)
        if memory is not None and hasattr(inner, "load_memory_state"):
            inner.load_memory_state(memory)

    def begin_valid_epoch(self, epoch, model):
        self._reset_memory(model, "eval")  # (the training memory stays: validation may come mid-epoch)

    # ------------------------------------------------------------ generation
    def build_dataset_for_inference(self, src_tokens, src_lengths, **kwargs):
        return PromptDataset(src_tokens, self.dictionary.pad(), self.dictionary.eos())

    def inference_step(self, generator, models, sample, prefix_tokens=None, constraints=None):
        """Continues each prompt: generation starts from ``</s>`` with the prompt forced as a prefix,
        so the prompt goes into the memory (the incremental state) token by token.  ``--max-len-b``
        counts the tokens generated after the prompt (``--max-len-a`` is at least 1 here)."""
        with torch.no_grad():
            if constraints is not None:
                raise NotImplementedError("bptt_lm does not support constrained generation")
            prompt = sample["net_input"]["src_tokens"][:, 1:]  # (after the </s> of PromptDataset)
            if prefix_tokens is None and prompt.nelement():
                prefix_tokens = prompt
            max_len_a = getattr(generator, "max_len_a", None)
            if max_len_a is not None and max_len_a < 1:
                generator.max_len_a = 1
            try:
                return generator.generate(models, sample, prefix_tokens=prefix_tokens,
                                          bos_token=self.dictionary.eos())
            finally:
                if max_len_a is not None:
                    generator.max_len_a = max_len_a

    @property
    def source_dictionary(self):
        return self.dictionary

    @property
    def target_dictionary(self):
        return self.dictionary
