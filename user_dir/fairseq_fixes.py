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
* Checkpoints that a failed write can half-write.  ``save_checkpoint`` writes the first checkpoint of a save
  atomically (a ``.tmp`` file, then a rename) but copies it to ``checkpoint_last.pt`` / ``checkpoint_best.pt``
  in place (``shutil.copyfile``): a full disk or a kill during the copy leaves a truncated
  ``checkpoint_last.pt``, and the next start cannot resume.  The copies now go to a ``.tmp`` file renamed
  over the target.  ``_torch_persistent_save`` retries a failed ``torch.save`` on the same file handle,
  after the bytes of the failed attempt, so a retry that succeeds writes an unreadable file; each attempt
  now starts again at the beginning of the file.  A write that fails for good removes its ``.tmp`` file and
  raises :class:`CheckpointWriteError` naming the file; the checkpoints written before are unchanged.
* ``--patience`` forgets its count when training resumes.  ``fairseq_cli.train.should_stop_early`` keeps the
  best validation score and the number of validations since it on itself, and no checkpoint saves them: a run
  restarted from ``checkpoint_last.pt`` takes its first validation as the best and counts from zero, so an
  interrupted run trains up to ``--patience`` epochs longer than an uninterrupted one (and, restarted often
  enough, never stops).  Each checkpoint now also holds the count (``extra_state["patience"]``), and it comes
  back whenever fairseq restores the best score with the checkpoint (not after ``--reset-meters``,
  ``--reset-optimizer`` or ``--finetune-from-model``).  Checkpoints written before keep fairseq's behaviour.
* ``np.compat.long`` (removed in numpy 2) is used by ``TokenBlockDataset``
  with ``--sample-break-mode eos`` and by ``LanguagePairDataset``; a tiny
  ``numpy.compat`` stand-in with ``long = int64`` is provided when missing.
"""
import contextvars
import functools
import logging
import os
import shutil
import sys
import time

import torch
from fairseq import checkpoint_utils, file_io, models, search
from fairseq.data import data_utils

from .checkpoint_safety import CheckpointError

logger = logging.getLogger(__name__)


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


class CheckpointWriteError(CheckpointError, OSError):
    """A checkpoint could not be written (module docstring); the message names the file."""


class AtomicCopyPathManager(file_io.PathManager):
    """fairseq's ``PathManager`` whose ``copy`` of a local file never leaves a half-written target."""

    _fairseq_struct_fixed = True

    @staticmethod
    def copy(src_path, dst_path, overwrite=False):
        if file_io.PathManager.path_requires_pathmanager(dst_path):
            return file_io.PathManager.copy(src_path, dst_path, overwrite=overwrite)
        tmp = dst_path + ".tmp"
        try:
            shutil.copyfile(src_path, tmp)
            os.replace(tmp, dst_path)
        except OSError as e:
            _remove(tmp)
            raise CheckpointWriteError(f"could not write checkpoint {dst_path} ({e}); the checkpoints written "
                                       f"before it are unchanged") from None
        return True


def _remove(path):
    try:
        os.remove(path)
    except OSError:
        pass


def _save_from_start(obj, f, attempts=3, wait_s=2.5):
    """``torch.save`` with fairseq's retries, each attempt from the handle's starting position."""
    if isinstance(f, str):
        with file_io.PathManager.open(f, "wb") as h:
            return _save_from_start(obj, h, attempts, wait_s)
    start = f.tell() if f.seekable() else None
    for attempt in range(attempts):
        try:
            if start is not None:
                f.seek(start)
                f.truncate()
            return torch.save(obj, f)
        except Exception as e:
            if attempt == attempts - 1 or start is None:
                raise
            logger.warning(f"writing a checkpoint failed ({e}); trying again")
            time.sleep(wait_s)


_save_from_start._fairseq_struct_fixed = True


def _clean_failed_save(persistent_save):
    @functools.wraps(persistent_save)
    def patched(obj, filename, async_write=False):
        try:
            return persistent_save(obj, filename, async_write)
        except OSError as e:
            if isinstance(filename, str) and not file_io.PathManager.path_requires_pathmanager(filename):
                _remove(filename + ".tmp")
            raise CheckpointWriteError(f"could not write checkpoint {filename} ({e}); the checkpoints written "
                                       f"before it are unchanged") from None

    patched._fairseq_struct_fixed = True
    return patched


def _patience_counter():
    """fairseq-train's early-stopping function (None outside fairseq-train and fairseq-hydra-train)."""
    train = sys.modules.get("fairseq_cli.train")
    return getattr(train, "should_stop_early", None)


class _TrainerSavingPatience:
    """The trainer as ``save_checkpoint`` sees it: its checkpoints also hold ``--patience``'s count."""

    def __init__(self, trainer):
        self._trainer = trainer

    def __getattr__(self, name):
        return getattr(self._trainer, name)

    def save_checkpoint(self, filename, extra_state):
        counter = _patience_counter()
        if counter is not None and hasattr(counter, "best"):
            extra_state = {**extra_state, "patience": {"best": counter.best, "num_runs": counter.num_runs}}
        return self._trainer.save_checkpoint(filename, extra_state)


def _save_with_patience(save_checkpoint):
    @functools.wraps(save_checkpoint)
    def patched(cfg, trainer, epoch_itr, val_loss):
        return save_checkpoint(cfg, _TrainerSavingPatience(trainer), epoch_itr, val_loss)

    patched._fairseq_struct_fixed = True
    return patched


def _load_with_patience(load_checkpoint):
    @functools.wraps(load_checkpoint)
    def patched(cfg, trainer, **passthrough_args):
        extra_state, epoch_itr = load_checkpoint(cfg, trainer, **passthrough_args)
        state = (extra_state or {}).get("patience")
        counter = _patience_counter()
        # fairseq restores the best score (``save_checkpoint.best = extra_state["best"]``) only when the run
        # continues this checkpoint's training (no reset flags, no fine-tuning): the count comes back with it
        restored = extra_state is not None and "best" in extra_state and \
            checkpoint_utils.save_checkpoint.__dict__.get("best") is extra_state["best"]
        if state is not None and counter is not None and restored:
            counter.best, counter.num_runs = state["best"], state["num_runs"]
            logger.info(f"--patience: {state['num_runs']} validation(s) since the best ({state['best']}), "
                        f"restored from the checkpoint")
        return extra_state, epoch_itr

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
    if not getattr(checkpoint_utils.PathManager, "_fairseq_struct_fixed", False):
        checkpoint_utils.PathManager = AtomicCopyPathManager
    checkpoint_utils._torch_persistent_save = _save_from_start
    if not getattr(checkpoint_utils.save_checkpoint, "_fairseq_struct_fixed", False):
        checkpoint_utils.save_checkpoint = _save_with_patience(checkpoint_utils.save_checkpoint)
    if not getattr(checkpoint_utils.load_checkpoint, "_fairseq_struct_fixed", False):
        checkpoint_utils.load_checkpoint = _load_with_patience(checkpoint_utils.load_checkpoint)
    if not getattr(checkpoint_utils.torch_persistent_save, "_fairseq_struct_fixed", False):
        checkpoint_utils.torch_persistent_save = _clean_failed_save(checkpoint_utils.torch_persistent_save)
