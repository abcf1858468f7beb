"""Counts host synchronisations (``.item()``, ``bool(tensor)``, ...) made by the plugin's code.

On a GPU each of these waits for every queued kernel: one per layer stalls the pipeline.
CPU has no ``torch.cuda.set_sync_debug_mode``, so the tensor methods that copy a value
to the host are patched for the duration of a block and every call whose caller is a
file under ``user_dir/`` is recorded.  Calls made by fairseq's or torch's own code are
kept apart in ``syncs.external`` (they are not ours to fix).
"""
import contextlib
import os
import sys

import torch

USER_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "user_dir")
# the Tensor methods that read a value back to the host
SYNC_METHODS = ("item", "tolist", "nonzero", "__bool__", "__int__", "__float__", "__index__")


class HostSyncs(list):
    """``"file:line: method"`` of each plugin sync; ``external`` holds everyone else's."""

    def __init__(self):
        super().__init__()
        self.external = []


def _caller(depth=2):
    frame = sys._getframe(depth)
    return frame.f_code.co_filename, frame.f_lineno


@contextlib.contextmanager
def count_host_syncs(plugin_dirs=(USER_DIR,)):
    """Within the block, records every host sync; yields a :class:`HostSyncs` list."""
    syncs = HostSyncs()
    originals = {name: getattr(torch.Tensor, name) for name in SYNC_METHODS}
    roots = tuple(os.path.realpath(d) + os.sep for d in plugin_dirs)

    def patched(name):
        original = originals[name]

        def method(self, *args, **kwargs):
            filename, line = _caller()
            entry = f"{os.path.basename(filename)}:{line}: {name}"
            (syncs if os.path.realpath(filename).startswith(roots) else syncs.external).append(entry)
            return original(self, *args, **kwargs)

        return method

    for name in SYNC_METHODS:
        setattr(torch.Tensor, name, patched(name))
    try:
        yield syncs
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
