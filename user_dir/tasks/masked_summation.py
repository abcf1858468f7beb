"""``masked_summation``: the paper's long-range simulation task (Guo et al. 2019, Sec. 5.1), generated on the fly.

What the paper says: the model must "recognize the mask value and gather columns in different positions";
the difficulty grows when the length n is much larger than the number of columns k; the metric is MSE;
there are 10k/10k/10k train/dev/test samples (``--train-size``, ``--valid-size``, ``--test-size``).  The
figure with the exact definition did not survive extraction, so the task is a reconstruction.

Reconstruction decisions
------------------------
1. *Inputs*: n vectors ``[x_i; m_i]`` (``--seq-len`` n) with x_i ~ U(0, 1)^k (``--num-columns`` k,
   default 10) and a mask bit m_i; exactly ``--num-masked`` positions (default k), anywhere in the
   sequence, have m_i = 1.
2. *Target*: the k-vector y = sum_i m_i x_i.
3. *Model and loss*: the model regresses y from the sentence vector (s^T + max H^T -> MLP), its inputs
   the continuous ``[x_i; m_i]`` (``--input-features`` is set to k + 1), under the
   ``masked_summation_mse`` criterion (mean squared error per target value).
4. *Data*: every split is generated deterministically from ``--seed`` and the split name, so train, valid
   and test differ and a rerun reproduces them; ``--min-seq-len`` < ``--seq-len`` gives variable-length,
   right-padded batches.
"""
import zlib
from dataclasses import dataclass, field

import numpy as np
import torch
from fairseq.data import FairseqDataset
from fairseq.dataclass import FairseqDataclass
from fairseq.tasks import FairseqTask, register_task
from omegaconf import II


def mean_predictor_mse(num_masked):
    """The MSE of always predicting the targets' mean: each target value is a sum of ``num_masked`` draws of
    U(0, 1), whose variance is ``num_masked / 12``.  A model whose MSE is not below it has learnt nothing."""
    return num_masked / 12


class MaskedSummationDataset(FairseqDataset):
    def __init__(self, size, seq_len, min_seq_len, k, num_masked, seed):
        rng = np.random.RandomState(seed)
        self.lengths = rng.randint(min_seq_len, seq_len + 1, size=size) if min_seq_len < seq_len \
            else np.full(size, seq_len)
        self.items = []
        for n in self.lengths:
            x = rng.rand(n, k).astype(np.float32)
            m = np.zeros((n, 1), dtype=np.float32)
            m[rng.choice(n, size=min(num_masked, n), replace=False)] = 1.0
            self.items.append((torch.from_numpy(np.concatenate([x, m], 1)), torch.from_numpy((x * m).sum(0))))
        self.sizes = self.lengths

    def __getitem__(self, index):
        feats, target = self.items[index]
        return {"id": index, "features": feats, "target": target}

    def __len__(self):
        return len(self.items)

    def num_tokens(self, index):
        return int(self.lengths[index])

    def size(self, index):
        return int(self.lengths[index])

    def ordered_indices(self):
        return np.lexsort((np.arange(len(self)), self.lengths))

    def collater(self, samples):
        if not samples:
            return {}
        n = max(s["features"].shape[0] for s in samples)
        feats = torch.zeros(len(samples), n, samples[0]["features"].shape[1])
        for i, s in enumerate(samples):
            feats[i, : s["features"].shape[0]] = s["features"]
        lengths = torch.tensor([s["features"].shape[0] for s in samples])
        return {
            "id": torch.tensor([s["id"] for s in samples]),
            "net_input": {"src_features": feats, "src_lengths": lengths},
            "target": torch.stack([s["target"] for s in samples]),
            "ntokens": int(lengths.sum()),
            "nsentences": len(samples),
        }


@dataclass
class MaskedSummationConfig(FairseqDataclass):
    seq_len: int = field(default=200, metadata={"help": "sequence length n"})
    min_seq_len: int = field(default=0, metadata={"help": "0 = all sequences have seq_len; else random in [min, max]"})
    num_columns: int = field(default=10, metadata={"help": "k, size of each x_i and of the target"})
    num_masked: int = field(default=0, metadata={"help": "positions with mask bit 1; 0 = num_columns"})
    train_size: int = field(default=10000)
    valid_size: int = field(default=10000)
    test_size: int = field(default=10000)
    classification_head_name: str = field(default="masked_summation_head")
    seed: int = II("common.seed")


@register_task("masked_summation", dataclass=MaskedSummationConfig)
class MaskedSummationTask(FairseqTask):
    @classmethod
    def setup_task(cls, cfg, **kwargs):
        if cfg.min_seq_len > cfg.seq_len:
            raise ValueError(f"--min-seq-len {cfg.min_seq_len} is larger than --seq-len {cfg.seq_len}")
        return cls(cfg)

    def load_dataset(self, split, combine=False, **kwargs):
        sizes = {"train": self.cfg.train_size, "valid": self.cfg.valid_size, "test": self.cfg.test_size}
        if split not in sizes:
            raise KeyError(f"masked_summation generates the splits train, valid and test, not {split!r}")
        seed = (self.cfg.seed * 1000003 + zlib.crc32(split.encode())) % (2 ** 31)
        self.datasets[split] = MaskedSummationDataset(
            sizes[split], self.cfg.seq_len, self.cfg.min_seq_len or self.cfg.seq_len, self.cfg.num_columns,
            self.cfg.num_masked or self.cfg.num_columns, seed)

    def build_model(self, cfg, from_checkpoint=False):
        from fairseq import models
        from omegaconf import open_dict

        with open_dict(cfg):
            cfg.input_features = self.cfg.num_columns + 1
            cfg.max_positions = max(getattr(cfg, "max_positions", 0) or 0, self.cfg.seq_len)
        model = models.build_model(cfg, self, from_checkpoint)
        model.register_classification_head(self.cfg.classification_head_name, num_classes=self.cfg.num_columns)
        return model

    def max_positions(self):
        return self.cfg.seq_len

    @property
    def source_dictionary(self):
        return None

    @property
    def target_dictionary(self):
        return None
