"""``sentence_pair_classification``: NLI with a sentence-vector model (paper Sec. 5.3).

Same data layout as fairseq's ``sentence_prediction`` for pairs (``DATA/input0``,
``DATA/input1``, ``DATA/label``; ``preprocess/snli_prepare.py`` writes it), but the two
sentences are *not* concatenated: the batch carries the premise as ``src_tokens`` and the
hypothesis as ``pair_tokens``, each model encodes them separately and classifies four
pair features with an MLP (the head is registered with ``input_multiplier=4``): the Star
model's ``--nli-features paper`` (default) gives [r1; r2; |r1 - r2|; r1 - r2] as in the
paper's text, ``--nli-features mult`` the usual [r1; r2; |r1 - r2|; r1 * r2].  Training and validation use fairseq's ``sentence_prediction``
criterion unchanged (``--criterion sentence_prediction``).
"""
import os
from dataclasses import dataclass

import numpy as np
from fairseq.data import (IdDataset, NestedDictionaryDataset, NumelDataset, NumSamplesDataset, OffsetTokensDataset,
                          RightPadDataset, SortDataset, StripTokenDataset, data_utils)
from fairseq.tasks import register_task
from fairseq.tasks.sentence_prediction import SentencePredictionConfig, SentencePredictionTask


@dataclass
class SentencePairClassificationConfig(SentencePredictionConfig):
    pass


@register_task("sentence_pair_classification", dataclass=SentencePairClassificationConfig)
class SentencePairClassificationTask(SentencePredictionTask):
    def load_dataset(self, split, combine=False, **kwargs):
        def load(key, dictionary):
            path = os.path.join(self.cfg.data, key, split)
            ds = data_utils.load_indexed_dataset(path, dictionary, combine=combine)
            if ds is None:
                raise FileNotFoundError(f"sentence_pair_classification: no dataset {path}.{{bin,idx}} "
                                        f"(run preprocess/snli_prepare.py)")
            return ds

        first, second = load("input0", self.source_dictionary), load("input1", self.source_dictionary)
        if len(first) != len(second):
            raise ValueError(f"{self.cfg.data}: input0/{split} has {len(first)} sentences, "
                             f"input1/{split} has {len(second)}")
        for name, ds in (("input0", first), ("input1", second)):
            longest = int(ds.sizes.max()) if len(ds) else 0
            if longest > self.cfg.max_positions:
                raise ValueError(f"{self.cfg.data}/{name}/{split}: a sentence of {longest} tokens is longer than "
                                 f"the position table (--max-positions {self.cfg.max_positions})")
        labels = OffsetTokensDataset(
            StripTokenDataset(load("label", self.label_dictionary), id_to_strip=self.label_dictionary.eos()),
            offset=-self.label_dictionary.nspecial)
        pad = self.source_dictionary.pad()
        dataset = NestedDictionaryDataset({
            "id": IdDataset(),
            "net_input": {
                "src_tokens": RightPadDataset(first, pad_idx=pad),
                "src_lengths": NumelDataset(first, reduce=False),
                "pair_tokens": RightPadDataset(second, pad_idx=pad),
                "pair_lengths": NumelDataset(second, reduce=False),
            },
            "target": labels,
            "nsentences": NumSamplesDataset(),
            "ntokens": NumelDataset(first, reduce=True),
        }, sizes=[np.maximum(first.sizes, second.sizes)])
        if not self.cfg.no_shuffle:
            with data_utils.numpy_seed(self.cfg.seed):
                shuffle = np.random.permutation(len(dataset))
            dataset = SortDataset(dataset, sort_order=[shuffle])
        self.datasets[split] = dataset
        return dataset

    def build_model(self, cfg, from_checkpoint=False):
        from fairseq import models
        from omegaconf import open_dict

        with open_dict(cfg):
            cfg.max_positions = self.cfg.max_positions
        model = models.build_model(cfg, self, from_checkpoint)
        if not hasattr(model, "register_classification_head"):
            raise ValueError("sentence_pair_classification needs a model with classification heads "
                             "(--arch star_transformer*, onlstm_classifier*, fasttrees_lstm_classifier*)")
        model.register_classification_head(self.cfg.classification_head_name, num_classes=self.cfg.num_classes,
                                           input_multiplier=4)
        return model
