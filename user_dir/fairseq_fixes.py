"""Fixes for fairseq bugs (most would silently lose data) and one gap, applied on plugin import.

* ``data_utils.batch_by_size`` drops the last batch when its size is not a
  multiple of ``--required-batch-size-multiple`` (default 8): fairseq issue
  #5036. ``fairseq-generate`` then translates fewer sentences than the test
  set has, and ``fairseq-validate``/``fairseq-eval-lm`` score fewer tokens.
  The patched version keeps that batch.
* ``search.DiverseBeamSearch`` (``--diverse-beam-groups``) keeps its group overlaps per row
  of the batch, but ``SequenceGenerator`` hands it the sentences' dataset ids
  (``sample["id"]``) to index them.  From the second batch on the ids run past the
  batch (``IndexError`` in ``search.py``, with fairseq's own ``transformer`` too);
  within a batch they pick other sentences' overlaps.  The patched class maps the ids
  back to the rows of the batch's first step.
* ``models.build_model`` is called with ``from_checkpoint=True`` when fairseq loads a trained
  model (``checkpoint_utils.load_model_ensemble_and_task``: fairseq-validate, -generate, hub
  ``from_pretrained``), but does not hand the flag on to the model's ``build_model``.  The wrapped
  version notes it for the duration of the build (:func:`building_from_checkpoint`), so that a
  model does not read files whose contents the checkpoint holds (``--pretrained-embeddings``).
* ``np.compat.long`` (removed in numpy 2) is used by ``TokenBlockDataset``
  with ``--sample-break-mode eos`` and by ``LanguagePairDataset``; a tiny
  ``numpy.compat`` stand-in with ``long = int64`` is provided when missing.
"""
import contextvars
import functools

import torch
from fairseq import models, search
from fairseq.data import data_utils


def _keep_last_batch(batch_by_size):
    @functools.wraps(batch_by_size)
    def patched(indices, num_tokens_fn, num_tokens_vec=None, max_tokens=None, max_sentences=None,
                required_batch_size_multiple=1, fixed_shapes=None):
        batches = batch_by_size(indices, num_tokens_fn, num_tokens_vec, max_tokens, max_sentences,
                                required_batch_size_multiple, fixed_shapes)
        if fixed_shapes is None:
            covered = sum(len(b) for b in batches)
            if covered < len(indices):  # batches are consecutive chunks of ``indices``
                batches.append(indices[covered:])
        return batches

    patched._fairseq_struct_fixed = True
    return patched


class DiverseBeamSearchByRow(search.DiverseBeamSearch):
    """fairseq's diverse beam search, its overlaps indexed by batch row (module docstring)."""

    _fairseq_struct_fixed = True

    def step(self, step, lprobs, scores, prev_output_tokens=None, original_batch_idxs=None):
        if original_batch_idxs is not None:
            if step == 0:  # the batch's sentences, one per row of the overlaps
                self.batch_ids = original_batch_idxs
            # row of each remaining sentence: a device-side lookup, no host sync
            original_batch_idxs = (original_batch_idxs.unsqueeze(1) == self.batch_ids.unsqueeze(0)).to(
                torch.long).argmax(1)
        return super().step(step, lprobs, scores, prev_output_tokens, original_batch_idxs)


_FROM_CHECKPOINT = contextvars.ContextVar("fairseq_struct_from_checkpoint", default=False)


def building_from_checkpoint() -> bool:
    """Whether the model being built will be loaded from a trained checkpoint (module docstring)."""
    return _FROM_CHECKPOINT.get()


def _note_from_checkpoint(build_model):
    @functools.wraps(build_model)
    def patched(cfg, task, from_checkpoint=False):
        token = _FROM_CHECKPOINT.set(bool(from_checkpoint))
        try:
            return build_model(cfg, task, from_checkpoint)
        finally:
            _FROM_CHECKPOINT.reset(token)

    patched._fairseq_struct_fixed = True
    return patched


def _numpy_compat():
    import types

    import numpy as np

    try:
        np.compat.long
    except AttributeError:
        np.compat = types.SimpleNamespace(long=np.int64)


def install():
    _numpy_compat()
    if not getattr(search.DiverseBeamSearch, "_fairseq_struct_fixed", False):
        search.DiverseBeamSearch = DiverseBeamSearchByRow
    if not getattr(models.build_model, "_fairseq_struct_fixed", False):
        models.build_model = _note_from_checkpoint(models.build_model)
    if not getattr(data_utils.batch_by_size, "_fairseq_struct_fixed", False):
        data_utils.batch_by_size = _keep_last_batch(data_utils.batch_by_size)
