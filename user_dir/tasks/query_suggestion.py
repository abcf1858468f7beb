"""Task ``query_suggestion``: predict the next query of a search session (MTN, arXiv 1908.10408, Sec. 5).

Data (``DATA`` is the task's data directory):

* binarized (recommended, what ``preprocess/query_suggestion_prepare.py`` writes
  with ``fairseq-preprocess``): ``{split}.src-tgt.{src,tgt}`` and ``dict.{src,tgt}.txt``;
* raw sessions: ``DATA/{split}.ses``, HRED/AOL format (one session per line,
  queries separated by TAB, words by spaces), read directly with the
  dictionaries ``dict.{src,tgt}.txt`` of ``DATA``.  Bad sessions (a single
  query, an empty query, a query longer than ``--max-query-length``) stop
  loading with the file and line named, or with ``--bad-sessions skip`` are
  dropped and counted in the log.

Examples: each session of m queries gives m − 1 examples (q_1..q_j → q_{j+1}),
one per next query; the prefix is the source row ``q_1 </q> … q_j`` (see
:mod:`user_dir.modules.query_sessions`).  Training therefore covers every next
query of every session in each epoch, and no example's source contains a query
that comes after its target.  (The masked session encoder would also allow
scoring all next queries of a session in one pass; prefix examples are used so
that fairseq's batching and ``fairseq-generate`` work unchanged.)

Validation metrics with ``--eval-suggestions``: beam search with
``--eval-nbest k`` beams and k suggestions per example, logged as ``bleu``
(sacrebleu, best suggestion), ``em@1``, ``em@k`` and ``mrr`` (see
:mod:`user_dir.modules.query_suggestion_metrics`).
"""
import logging
import os
from argparse import Namespace
from dataclasses import dataclass, field

import numpy as np
import torch
from fairseq import metrics, utils
from fairseq.data import BaseWrapperDataset, LanguagePairDataset, ListDataset
from fairseq.dataclass import ChoiceEnum
from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask

from ..modules import query_suggestion_metrics as qs_metrics
from ..modules.mtn_session_encoder import session_layout
from ..modules.query_sessions import SEP, flatten, read_sessions, session_examples, typed_session

logger = logging.getLogger(__name__)

BLEU_ORDER = 4


@dataclass
class QuerySuggestionConfig(TranslationConfig):
    max_query_length: int = field(
        default=16, metadata={"help": "longest query in words; MTN's query projection pads every query to this "
                                      "length (+1 slot for the end-of-query token)"})
    max_context_queries: int = field(
        default=0, metadata={"help": "raw .ses input: keep only the last N queries of a prefix (0 = all)"})
    bad_sessions: ChoiceEnum(["error", "skip"]) = field(
        default="error", metadata={"help": "raw .ses input: stop at a bad session (file and line named) or skip "
                                           "it and count it in the log"})
    eval_suggestions: bool = field(
        default=False, metadata={"help": "at validation, beam-search suggestions and log bleu, em@1, em@k, mrr"})
    eval_nbest: int = field(default=5, metadata={"help": "k: beam size and number of suggestions at validation"})
    eval_max_len: int = field(default=0, metadata={"help": "longest suggestion at validation (0: --max-query-length + 1)"})


class SessionLayoutDataset(BaseWrapperDataset):
    """Adds ``net_input["session_layout"]`` (:func:`~user_dir.modules.mtn_session_encoder.session_layout`)
    to every batch, so the MTN encoder finds its queries without reading the device back."""

    def __init__(self, dataset, src_dict, max_query_length):
        super().__init__(dataset)
        self.src_dict, self.slots = src_dict, max_query_length + 1

    def collater(self, samples):
        batch = self.dataset.collater(samples)
        if batch:
            d = self.src_dict
            batch["net_input"]["session_layout"] = session_layout(
                batch["net_input"]["src_tokens"], d.pad(), d.eos(), d.index(SEP), self.slots)
        return batch


@register_task("query_suggestion", dataclass=QuerySuggestionConfig)
class QuerySuggestionTask(TranslationTask):
    """(session prefix → next query) examples; see the module docstring."""

    cfg: QuerySuggestionConfig

    @classmethod
    def setup_task(cls, cfg, **kwargs):
        if cfg.source_lang is None and cfg.target_lang is None:
            cfg.source_lang, cfg.target_lang = "src", "tgt"
        data_dir = utils.split_paths(cfg.data)[0]
        for lang in (cfg.source_lang, cfg.target_lang):
            path = os.path.join(data_dir, f"dict.{lang}.txt")
            if not os.path.isfile(path):
                raise FileNotFoundError(f"{path} not found: build the data directory with "
                                        f"preprocess/query_suggestion_prepare.py")
        task = super().setup_task(cfg, **kwargs)
        if task.src_dict.index(SEP) == task.src_dict.unk():
            raise ValueError(f"{data_dir}/dict.{cfg.source_lang}.txt has no query separator '{SEP}': sessions are "
                             f"fed as queries joined by '{SEP}' (preprocess/query_suggestion_prepare.py)")
        return task

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        self._load_examples(split, epoch=epoch, combine=combine, **kwargs)
        self.datasets[split] = SessionLayoutDataset(self.datasets[split], self.src_dict, self.cfg.max_query_length)

    def _load_examples(self, split, epoch=1, combine=False, **kwargs):
        raw = os.path.join(utils.split_paths(self.cfg.data)[0], f"{split}.ses")
        if not os.path.isfile(raw):
            return super().load_dataset(split, epoch=epoch, combine=combine, **kwargs)
        sessions, _ = read_sessions(raw, self.cfg.max_query_length, self.cfg.bad_sessions)
        src, tgt = [], []
        for queries in sessions:
            for context, target in session_examples(queries, self.cfg.max_context_queries):
                src.append(self.src_dict.encode_line(flatten(context), add_if_not_exist=False).long())
                tgt.append(self.tgt_dict.encode_line(" ".join(target), add_if_not_exist=False).long())
        if not src:
            raise ValueError(f"{raw}: no usable session (a session needs at least two queries)")
        logger.info(f"{raw}: {len(sessions)} sessions, {len(src)} (prefix -> next query) examples")
        src_sizes, tgt_sizes = np.array([len(s) for s in src]), np.array([len(t) for t in tgt])
        self.datasets[split] = LanguagePairDataset(
            ListDataset(src, src_sizes), src_sizes, self.src_dict, ListDataset(tgt, tgt_sizes), tgt_sizes,
            self.tgt_dict, left_pad_source=self.cfg.left_pad_source, left_pad_target=self.cfg.left_pad_target,
        )

    def get_interactive_tokens_and_lengths(self, lines, encode_fn):
        """``fairseq-interactive`` input: a session per line, its queries separated by TAB (the ``.ses``
        layout) or by `` </q> `` (:func:`~user_dir.modules.query_sessions.typed_session`)."""
        tokens = [self.source_dictionary.encode_line(typed_session(line, encode_fn), add_if_not_exist=False).long()
                  for line in lines]
        return tokens, [t.numel() for t in tokens]

    def build_model(self, cfg, from_checkpoint=False):
        model = super().build_model(cfg, from_checkpoint)
        if self.cfg.eval_suggestions:
            k = self.cfg.eval_nbest
            max_len = self.cfg.eval_max_len or self.cfg.max_query_length + 1
            self.suggestion_generator = self.build_generator(
                [model], Namespace(beam=k, nbest=k, max_len_a=0, max_len_b=max_len))
        return model

    def suggestions(self, generator, model, sample):
        """References and n-best suggestion strings (best first) of a batch."""
        def text(tokens):
            return self.tgt_dict.string(tokens.int().cpu(), unk_string="UNKNOWNTOKENINHYP")

        out = self.inference_step(generator, [model], sample, prefix_tokens=None)
        refs = [self.tgt_dict.string(utils.strip_pad(t, self.tgt_dict.pad()).int().cpu(),
                                     unk_string="UNKNOWNTOKENINREF") for t in sample["target"]]
        return refs, [[text(h["tokens"]) for h in hyps] for hyps in out]

    def valid_step(self, sample, model, criterion):
        loss, sample_size, logging_output = super().valid_step(sample, model, criterion)
        if self.cfg.eval_suggestions:
            refs, nbest = self.suggestions(self.suggestion_generator, model, sample)
            ks = sorted({1, self.cfg.eval_nbest})
            for key, value in qs_metrics.rank_sums(refs, nbest, ks).items():
                logging_output[f"_qs_{key}"] = value
            b = qs_metrics.bleu(refs, [h[0] if h else "" for h in nbest])
            logging_output["_bleu_sys_len"], logging_output["_bleu_ref_len"] = b.sys_len, b.ref_len
            for i in range(BLEU_ORDER):
                logging_output[f"_bleu_counts_{i}"] = b.counts[i]
                logging_output[f"_bleu_totals_{i}"] = b.totals[i]
        return loss, sample_size, logging_output

    def reduce_metrics(self, logging_outputs, criterion):
        super(TranslationTask, self).reduce_metrics(logging_outputs, criterion)
        if not self.cfg.eval_suggestions:
            return

        def total(key):
            value = sum(log.get(key, 0) for log in logging_outputs)
            return value.cpu() if torch.is_tensor(value) else value

        n = total("_qs_n")
        if n == 0:
            return
        for k in sorted({1, self.cfg.eval_nbest}):
            metrics.log_scalar(f"_qs_em@{k}", total(f"_qs_em@{k}"))
            metrics.log_derived(f"em@{k}", lambda m, k=k: round(100.0 * m[f"_qs_em@{k}"].sum / m["_qs_n"].sum, 2))
        metrics.log_scalar("_qs_n", n)
        metrics.log_scalar("_qs_rr", total("_qs_rr"))
        metrics.log_derived("mrr", lambda m: round(100.0 * m["_qs_rr"].sum / m["_qs_n"].sum, 2))
        metrics.log_scalar("_bleu_counts", np.array([total(f"_bleu_counts_{i}") for i in range(BLEU_ORDER)]))
        metrics.log_scalar("_bleu_totals", np.array([total(f"_bleu_totals_{i}") for i in range(BLEU_ORDER)]))
        metrics.log_scalar("_bleu_sys_len", total("_bleu_sys_len"))
        metrics.log_scalar("_bleu_ref_len", total("_bleu_ref_len"))
        metrics.log_derived("bleu", _derived_bleu)


def _derived_bleu(meters):
    from sacrebleu.metrics import BLEU

    score = BLEU.compute_bleu(correct=meters["_bleu_counts"].sum, total=meters["_bleu_totals"].sum,
                              sys_len=int(meters["_bleu_sys_len"].sum), ref_len=int(meters["_bleu_ref_len"].sum),
                              smooth_method="exp")
    return round(score.score, 2)
