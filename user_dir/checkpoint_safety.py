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
"""
import argparse
import functools
import importlib
import pickle
import re

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


class UnsafeCheckpointError(pickle.UnpicklingError):
    """A checkpoint references a global outside fairseq's allow-list."""


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


def _wrap_loader(load_fn):
    @functools.wraps(load_fn)
    def load_checkpoint_to_cpu(path, *args, **kwargs):
        try:
            return load_fn(path, *args, **kwargs)
        except pickle.UnpicklingError as e:
            found = re.search(r"GLOBAL ([\w.]+)", str(e))
            what = f"the global {found.group(1)}" if found else "a global"
            raise UnsafeCheckpointError(
                f"refusing to load checkpoint {path}: its pickle references {what}, which fairseq "
                f"checkpoints never contain; nothing in it was executed. If you trust the file, load it "
                f"yourself with torch.load(..., weights_only=False)."
            ) from None

    load_checkpoint_to_cpu._fairseq_struct_safe = True
    return load_checkpoint_to_cpu


def install():
    """Allow-lists fairseq's checkpoint globals and makes refusals name the file."""
    if hasattr(torch.serialization, "add_safe_globals"):
        torch.serialization.add_safe_globals(fairseq_checkpoint_globals())
    from fairseq import checkpoint_utils

    if not getattr(checkpoint_utils.load_checkpoint_to_cpu, "_fairseq_struct_safe", False):
        checkpoint_utils.load_checkpoint_to_cpu = _wrap_loader(checkpoint_utils.load_checkpoint_to_cpu)
