"""``sequence_tagging``: CoNLL-style token tagging (POS, NER) read directly from text files.

Files: ``DATA/{train,valid,test}.txt`` (or ``--{split}-file``), one token per line with
whitespace-separated columns, a blank line between sentences, ``-DOCSTART-`` lines
skipped (as is a first line that is a column header such as ``-TOKEN- -POSTAG- ...``).
``--word-column`` and ``--tag-column`` pick the columns (CoNLL-2003: 0 and 3 for NER,
1 for POS; negative = from the end).  Every line of a file must have the same number of
columns.  The word dictionary is ``DATA/dict.txt`` and the tag list ``DATA/tags.txt``
(written by ``preprocess/conll_tagging_prepare.py``); if absent they are built from the
training file.  A tag in a validation/test file that the tag list does not know is an
error naming the file and line.

The model (``--arch star_transformer*``) gets a tagging head over h_i^T (paper Sec. 5.4),
optionally with a CRF (``--crf``).  The ``sequence_tagging`` criterion reports token
accuracy, and at validation entity-level span precision/recall/F1 (seqeval's chunking,
micro-averaged, the conlleval convention).
"""
import logging
import os
import re
from dataclasses import dataclass, field

import numpy as np
import torch
from fairseq import utils
from fairseq.data import Dictionary, FairseqDataset, data_utils
from fairseq.dataclass import FairseqDataclass
from fairseq.tasks import FairseqTask, register_task
from omegaconf import II

logger = logging.getLogger(__name__)

_HEADER = re.compile(r"^-[A-Z]+-$")


class TaggingFormatError(ValueError):
    """A problem in a tagging file, reported with file and line."""


def read_conll(path, word_column=0, tag_column=-1, lowercase=False, with_tags=True):
    """Returns ``[(words, tags, first_line_number), ...]``; ``tags`` is None without ``with_tags``."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"tagging file not found: {path}")
    sents, words, tags, start, ncols = [], [], [], None, None
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            cols = line.split()
            if not cols:
                if words:
                    sents.append((words, tags if with_tags else None, start))
                words, tags = [], []
                continue
            if cols[0] == "-DOCSTART-" or (lineno == 1 and all(_HEADER.match(c) for c in cols)):
                continue
            if ncols is None:
                ncols = len(cols)
                need = max(word_column if word_column >= 0 else -word_column - 1,
                           (tag_column if tag_column >= 0 else -tag_column - 1) if with_tags else 0) + 1
                if ncols < need:
                    raise TaggingFormatError(
                        f"{path}:{lineno}: {ncols} column(s), but --word-column {word_column} / "
                        f"--tag-column {tag_column} need at least {need}")
            elif len(cols) != ncols:
                raise TaggingFormatError(
                    f"{path}:{lineno}: expected {ncols} columns (as on the first token line), found {len(cols)}: "
                    f"{line.rstrip()[:80]!r}")
            if not words:
                start = lineno
            w = cols[word_column]
            words.append(w.lower() if lowercase else w)
            if with_tags:
                tags.append(cols[tag_column])
    if words:
        sents.append((words, tags if with_tags else None, start))
    return sents


def span_counts(pred_tags, gold_tags):
    """(#correct, #predicted, #gold) entity spans of one sentence, seqeval/conlleval chunking."""
    from seqeval.metrics.sequence_labeling import get_entities

    pred, gold = set(get_entities(list(pred_tags))), set(get_entities(list(gold_tags)))
    return len(pred & gold), len(pred), len(gold)


class TaggingDataset(FairseqDataset):
    """Token ids and tag ids (0-based) per sentence; batches are right-padded."""

    def __init__(self, tokens, tags, pad, path=None, lines=None):
        self.tokens, self.tags, self.pad = tokens, tags, pad
        self.sizes = np.array([len(t) for t in tokens])
        self.path, self.lines = path, lines

    def __getitem__(self, index):
        return {"id": index, "source": self.tokens[index], "target": self.tags[index]}

    def __len__(self):
        return len(self.tokens)

    def num_tokens(self, index):
        return int(self.sizes[index])

    def size(self, index):
        return int(self.sizes[index])

    def ordered_indices(self):
        return np.lexsort((np.arange(len(self)), self.sizes))

    def collater(self, samples):
        if not samples:
            return {}
        src = data_utils.collate_tokens([s["source"] for s in samples], self.pad, left_pad=False)
        tgt = data_utils.collate_tokens([s["target"] for s in samples], 0, left_pad=False)
        lengths = torch.tensor([len(s["source"]) for s in samples])
        return {
            "id": torch.tensor([s["id"] for s in samples]),
            "net_input": {"src_tokens": src, "src_lengths": lengths},
            "target": tgt,
            "ntokens": int(lengths.sum()),
            "nsentences": len(samples),
        }


@dataclass
class SequenceTaggingConfig(FairseqDataclass):
    data: str = field(default="", metadata={"help": "directory with {train,valid,test}.txt, dict.txt, tags.txt"})
    word_column: int = field(default=0, metadata={"help": "column of the token"})
    tag_column: int = field(default=-1, metadata={"help": "column of the tag (CoNLL-2003: 3 NER, 1 POS)"})
    lowercase: bool = field(default=False, metadata={"help": "lowercase tokens"})
    crf: bool = field(default=False, metadata={"help": "CRF layer on top of the emissions"})
    max_positions: int = field(default=512, metadata={"help": "longest sentence (position table size)"})
    tagging_head_name: str = field(default="tagging_head")
    seed: int = II("common.seed")


@register_task("sequence_tagging", dataclass=SequenceTaggingConfig)
class SequenceTaggingTask(FairseqTask):
    def __init__(self, cfg, dictionary, tag_dictionary):
        super().__init__(cfg)
        self.dictionary = dictionary
        self.tags = tag_dictionary  # list of tag strings; index = class id

    @classmethod
    def setup_task(cls, cfg, **kwargs):
        dict_path, tags_path = os.path.join(cfg.data, "dict.txt"), os.path.join(cfg.data, "tags.txt")
        if os.path.exists(dict_path) and os.path.exists(tags_path):
            dictionary = Dictionary.load(dict_path)
            with open(tags_path, encoding="utf-8") as f:
                tags = [line.split()[0] for line in f if line.strip()]
        else:
            train = os.path.join(cfg.data, "train.txt")
            logger.info(f"no dict.txt/tags.txt in {cfg.data}: building them from {train}")
            dictionary, tags = build_dictionaries(read_conll(train, cfg.word_column, cfg.tag_column, cfg.lowercase))
        logger.info(f"[words] {len(dictionary)} types, [tags] {len(tags)}: {' '.join(tags[:20])}")
        return cls(cfg, dictionary, tags)

    def load_dataset(self, split, combine=False, **kwargs):
        path = os.path.join(self.cfg.data, f"{split}.txt")
        self.datasets[split] = self.dataset_from_file(path, with_tags=True)

    def dataset_from_file(self, path, with_tags=True):
        sents = read_conll(path, self.cfg.word_column, self.cfg.tag_column, self.cfg.lowercase, with_tags)
        tag_index = {t: i for i, t in enumerate(self.tags)}
        tokens, tags = [], []
        for words, ts, line in sents:
            if len(words) > self.cfg.max_positions:
                raise TaggingFormatError(
                    f"{path}:{line}: sentence of {len(words)} tokens is longer than the position table "
                    f"(--max-positions {self.cfg.max_positions})")
            tokens.append(torch.tensor([self.dictionary.index(w) for w in words], dtype=torch.long))
            if ts is None:
                tags.append(torch.zeros(len(words), dtype=torch.long))
                continue
            ids = []
            for k, t in enumerate(ts):
                if t not in tag_index:
                    raise TaggingFormatError(
                        f"{path}:{line + k}: tag {t!r} was not seen in training (known tags: "
                        f"{' '.join(self.tags)})")
                ids.append(tag_index[t])
            tags.append(torch.tensor(ids, dtype=torch.long))
        logger.info(f"{path}: {len(tokens)} sentences")
        return TaggingDataset(tokens, tags, self.dictionary.pad(), path, [s[2] for s in sents])

    def dataset_from_words(self, sentences, source="input"):
        """Sentences to tag, each a list of words (lowercased as in training with ``--lowercase``); one longer
        than the position table is refused, named by ``source`` and its number (its line, one per line)."""
        tokens = []
        for n, words in enumerate(sentences, 1):
            if len(words) > self.cfg.max_positions:
                raise TaggingFormatError(
                    f"{source}:{n}: sentence of {len(words)} tokens is longer than the position table "
                    f"(--max-positions {self.cfg.max_positions})")
            words = [w.lower() for w in words] if self.cfg.lowercase else words
            tokens.append(torch.tensor([self.dictionary.index(w) for w in words], dtype=torch.long))
        return TaggingDataset(tokens, [torch.zeros(len(t), dtype=torch.long) for t in tokens], self.dictionary.pad())

    def predict_tags(self, model, dataset, indices):
        """Tag strings of the sentences ``indices`` of a :class:`TaggingDataset`, in one batch on the model's
        device (:meth:`predict`); an empty sentence gets none."""
        tags = {i: [] for i in indices}
        nonempty = [i for i in indices if len(dataset.tokens[i]) > 0]
        if nonempty:
            device = next(model.parameters()).device
            batch = utils.apply_to_sample(lambda t: t.to(device), dataset.collater([dataset[i] for i in nonempty]))
            best = self.predict(model, batch)
            for row, i in enumerate(nonempty):
                tags[i] = [self.tags[t] for t in best[row, :len(dataset.tokens[i])].tolist()]
        return [tags[i] for i in indices]

    def build_model(self, cfg, from_checkpoint=False):
        from fairseq import models
        from omegaconf import open_dict

        with open_dict(cfg):
            cfg.max_positions = self.cfg.max_positions
        model = models.build_model(cfg, self, from_checkpoint)
        model.register_tagging_head(self.cfg.tagging_head_name, len(self.tags), crf=self.cfg.crf)
        return model

    def predict(self, model, sample):
        """Best tag ids (B, n) for a batch (padded positions: 0)."""
        feats, extra = model(**sample["net_input"])
        head = model.tagging_heads[self.cfg.tagging_head_name]
        return head.predict(head(feats), ~extra["padding_mask"])

    def max_positions(self):
        return self.cfg.max_positions

    @property
    def source_dictionary(self):
        return self.dictionary

    @property
    def target_dictionary(self):
        return self.dictionary


def build_dictionaries(sents):
    """Word dictionary (fairseq ``Dictionary``) and tag list (sorted) from training sentences."""
    d = Dictionary()
    tags = set()
    for words, ts, _ in sents:
        for w in words:
            d.add_symbol(w)
        tags.update(ts)
    d.finalize(padding_factor=1)
    return d, sorted(tags)
