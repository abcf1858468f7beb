"""Safe loading of fairseq checkpoints under torch ≥ 2.6.

torch 2.6 made ``torch.load(..., weights_only=True)`` the default, and
fairseq's ``load_checkpoint_to_cpu`` then fails on every checkpoint that
``fairseq-train`` writes ("Unsupported global: GLOBAL argparse.Namespace").
Rather than switching weights-only loading off (which would let a checkpoint
run arbitrary code), :func:`install` allow-lists exactly the globals that
fairseq checkpoints contain:

* ``argparse.Namespace`` — the legacy ``args`` entry;
* numpy arrays, dtypes and scalars — metric meters (e.g. BLEU statistics) in
  ``extra_state``.

Any other global — e.g. a ``__reduce__`` that reaches ``os.system`` — is
refused by torch's weights-only unpickler before it can run, and
:class:`UnsafeCheckpointError` names the file and the global.

A checkpoint that cannot be used is one :class:`CheckpointError`, whose message names the file and what
is wrong; the command-line tools print it as one line (no traceback) and exit with status 1:

* :class:`DamagedCheckpointError`: the file is truncated (an interrupted copy, a full disk), corrupted, or
  not a fairseq checkpoint at all;
* :class:`CheckpointMismatchError`: a sound checkpoint of another architecture than the run builds, or one
  trained with other dictionaries than those of the data given (its embedding sizes differ);
* ``fairseq-train --restore-file FILE`` with a FILE that does not exist (fairseq would start from scratch).
"""
import argparse
import functools
import importlib
import os
import pickle
import re
import sys
import zipfile

import torch

_NUMPY_GLOBALS = [
    # numpy ≥ 2 module paths, then numpy 1.x ones
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
]


class CheckpointError(Exception):
    """A checkpoint that cannot be used; the message names the file and the problem."""


class UnsafeCheckpointError(CheckpointError, pickle.UnpicklingError):
    """A checkpoint references a global outside fairseq's allow-list."""


class DamagedCheckpointError(CheckpointError, pickle.UnpicklingError):
    """A checkpoint file that cannot be read: truncated, corrupted, or not a fairseq checkpoint."""


class CheckpointMismatchError(CheckpointError, ValueError):
    """A readable checkpoint whose parameters do not fit the model built for this run."""


# arch of each checkpoint read in this process, for the mismatch messages
_CHECKPOINT_ARCH = {}


def _first_line(error):
    text = str(error).strip().splitlines()
    return (text[0] if text else type(error).__name__)[:200]


def checkpoint_arch(state):
    """The ``--arch`` a loaded checkpoint was trained with (``None`` if it does not say)."""
    cfg = state.get("cfg")
    model = cfg.get("model") if cfg is not None else None
    name = getattr(model, "_name", None) or (model.get("_name") if hasattr(model, "get") else None)
    if name is None and state.get("args") is not None:
        name = getattr(state["args"], "arch", None)
    return name


def fairseq_checkpoint_globals():
    """The objects a fairseq checkpoint's pickle may reference besides torch's defaults."""
    allowed = [argparse.Namespace]
    for module, name in _NUMPY_GLOBALS:
        try:
            allowed.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            continue
    try:  # numpy ≥ 1.25 pickles dtypes through their per-type classes
        import numpy as np

        allowed.extend(type(np.dtype(c)) for c in "?bhilqBHILQefdgFDG")
    except ImportError:
        pass
    return allowed


def _damaged(path, reason):
    return DamagedCheckpointError(
        f"checkpoint {path} is damaged: {reason}. It may have been cut short by an interrupted copy or a full "
        f"disk; use another checkpoint of the run (e.g. checkpoint_<epoch>_<update>.pt or checkpoint_best.pt)")


def archive_problem(path):
    """Why the file at ``path`` is not a sound checkpoint archive, or ``None``.

    torch writes checkpoints as zip archives with a CRC-32 of every entry but does not check them on load,
    so a corrupted tensor would load as wrong numbers: every entry is read once and checked here (entries
    written without a checksum, CRC 0, are skipped).  Files in torch's legacy format pass unchecked."""
    if os.path.getsize(path) == 0:
        return "the file is empty"
    with open(path, "rb") as f:
        is_zip_start = f.read(4) == b"PK\x03\x04"
    if not zipfile.is_zipfile(path):
        return "the archive is incomplete (truncated)" if is_zip_start else None
    try:
        with zipfile.ZipFile(path) as archive:
            for entry in archive.infolist():
                if entry.CRC == 0:
                    continue
                with archive.open(entry) as data:
                    while data.read(1 << 24):
                        pass
    except Exception as e:  # a damaged entry header fails in many ways (UnicodeDecodeError, struct.error ...)
        return f"the archive is corrupted ({_first_line(e)})"
    return None


def _wrap_loader(load_fn):
    @functools.wraps(load_fn)
    def load_checkpoint_to_cpu(path, *args, **kwargs):
        problem = archive_problem(path) if os.path.isfile(path) else None
        if problem is not None:
            raise _damaged(path, problem)
        try:
            state = load_fn(path, *args, **kwargs)
        except FileNotFoundError:
            raise
        except pickle.UnpicklingError as e:
            found = re.search(r"GLOBAL ([\w.]+)", str(e))
            if found is None and "Unsupported global" not in str(e):
                raise _damaged(path, "its contents cannot be unpickled (not a torch checkpoint?)") from None
            what = f"the global {found.group(1)}" if found else "a global"
            raise UnsafeCheckpointError(
                f"refusing to load checkpoint {path}: its pickle references {what}, which fairseq "
                f"checkpoints never contain; nothing in it was executed. If you trust the file, load it "
                f"yourself with torch.load(..., weights_only=False)."
            ) from None
        except MemoryError:
            raise
        except Exception as e:  # torch's and pickle's readers fail on damaged bytes in many ways
            if not zipfile.is_zipfile(path):
                raise _damaged(path, "it is not a torch checkpoint (neither a zip archive nor torch's legacy "
                                     "format)") from None
            raise _damaged(path, f"it cannot be read ({_first_line(e)})") from None
        if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
            raise _damaged(path, "it holds no model parameters (not a fairseq checkpoint)")
        _CHECKPOINT_ARCH[str(path)] = checkpoint_arch(state)
        return state

    load_checkpoint_to_cpu._fairseq_struct_safe = True
    return load_checkpoint_to_cpu


_SIZE_MISMATCH = re.compile(r"size mismatch for ([\w.]+): copying a param with shape torch\.Size\(\[([\d, ]*)\]\) "
                            r"from checkpoint, the shape in current model is torch\.Size\(\[([\d, ]*)\]\)")


def _mismatch(path, error, arch=None, data=None):
    """A :class:`CheckpointMismatchError` saying how the checkpoint differs from the model built here."""
    trained = _CHECKPOINT_ARCH.get(str(path))
    if arch is not None and trained is not None and trained != arch:
        return CheckpointMismatchError(f"checkpoint {path} was trained with --arch {trained}, but this run builds "
                                       f"--arch {arch}")
    text = str(error)
    if text.startswith("dictionary mismatch"):  # a model's own check (transformer_xl_lm)
        return CheckpointMismatchError(f"checkpoint {path}: {_first_line(error)}")
    size = _SIZE_MISMATCH.search(text)
    where = f" with the dictionaries of {data}" if data else ""
    if size and ("embed" in size.group(1) or "output_projection" in size.group(1) or "vocab" in size.group(1)):
        ours, theirs = size.group(2), size.group(3)
        return CheckpointMismatchError(
            f"checkpoint {path} was trained with another dictionary: {size.group(1)} is [{ours}] in the "
            f"checkpoint but [{theirs}] in the model built{where}; use the dictionaries the model was trained with")
    if size:
        return CheckpointMismatchError(
            f"checkpoint {path} does not fit the model built here: {size.group(1)} is [{size.group(2)}] in the "
            f"checkpoint but [{size.group(3)}] here (other --arch or model flags than it was trained with?)")
    keys = re.search(r"(Missing|Unexpected) key\(s\) in state_dict: ([^\n]{0,160})", text)
    detail = f" ({keys.group(1).lower()} parameters: {keys.group(2)})" if keys else f" ({_first_line(error)})"
    return CheckpointMismatchError(f"checkpoint {path} does not fit the model built here{detail}: it was trained "
                                   f"with another architecture or other model flags")


def _wrap_trainer_load(load_checkpoint):
    """``Trainer.load_checkpoint``: a given ``--restore-file`` must exist, and a checkpoint that does not fit
    the model is a :class:`CheckpointMismatchError` instead of fairseq's "please ensure that the
    architectures match"."""

    @functools.wraps(load_checkpoint)
    def patched(self, filename, *args, **kwargs):
        restore = self.cfg.checkpoint.restore_file
        if restore != "checkpoint_last.pt" and filename == restore and not os.path.isfile(filename):
            raise CheckpointError(f"--restore-file {filename}: no such checkpoint")
        try:
            return load_checkpoint(self, filename, *args, **kwargs)
        except CheckpointError:
            raise
        except Exception as e:
            if not str(e).startswith("Cannot load model parameters from checkpoint"):
                raise
            raise _mismatch(filename, e.__context__ or e, arch=getattr(self.cfg.model, "_name", None),
                            data=getattr(self.cfg.task, "data", None)) from None

    patched._fairseq_struct_safe = True
    return patched


def _wrap_ensemble_load(load_fn):
    """``load_model_ensemble_and_task`` (fairseq-generate, -eval-lm, -validate, hub ``from_pretrained``): a
    checkpoint whose parameters do not fit the model built for the data given is a
    :class:`CheckpointMismatchError`."""

    @functools.wraps(load_fn)
    def patched(filenames, arg_overrides=None, *args, **kwargs):
        try:
            return load_fn(filenames, arg_overrides, *args, **kwargs)
        except (RuntimeError, ValueError) as e:
            if "Error(s) in loading state_dict" not in str(e) and not str(e).startswith("dictionary mismatch"):
                raise
            path = filenames[0] if len(filenames) == 1 else ", ".join(map(str, filenames))
            task = kwargs.get("task", args[0] if args else None)
            data = (arg_overrides or {}).get("data") or getattr(getattr(task, "cfg", None), "data", None)
            raise _mismatch(path, e, data=data) from None

    patched._fairseq_struct_safe = True
    return patched


def _one_line_errors(previous_hook):
    """``sys.excepthook`` printing a :class:`CheckpointError` as one line: the command, then the message."""

    def hook(kind, value, tb):
        if isinstance(value, CheckpointError):
            print(f"{os.path.basename(sys.argv[0]) or 'python'}: error: {value}", file=sys.stderr)
            return
        previous_hook(kind, value, tb)

    hook._fairseq_struct_safe = True
    return hook


def install():
    """Allow-lists fairseq's checkpoint globals and makes refusals name the file."""
    if hasattr(torch.serialization, "add_safe_globals"):
        torch.serialization.add_safe_globals(fairseq_checkpoint_globals())
    from fairseq import checkpoint_utils

    from fairseq import trainer

    if not getattr(checkpoint_utils.load_checkpoint_to_cpu, "_fairseq_struct_safe", False):
        checkpoint_utils.load_checkpoint_to_cpu = _wrap_loader(checkpoint_utils.load_checkpoint_to_cpu)
    if not getattr(checkpoint_utils.load_model_ensemble_and_task, "_fairseq_struct_safe", False):
        checkpoint_utils.load_model_ensemble_and_task = _wrap_ensemble_load(
            checkpoint_utils.load_model_ensemble_and_task)
    if not getattr(trainer.Trainer.load_checkpoint, "_fairseq_struct_safe", False):
        trainer.Trainer.load_checkpoint = _wrap_trainer_load(trainer.Trainer.load_checkpoint)
    if not getattr(sys.excepthook, "_fairseq_struct_safe", False):
        sys.excepthook = _one_line_errors(sys.excepthook)
