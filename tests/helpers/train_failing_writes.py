"""``fairseq-train`` whose checkpoint writes fail as on a full disk (ENOSPC), after writing part of the file.

    FAIL_MODE=copy_last FAIL_AT=2 python tests/helpers/train_failing_writes.py DATA ... (fairseq-train's flags)

``FAIL_MODE``:
* ``copy_last``: the ``FAIL_AT``-th copy of a save to ``checkpoint_last.pt`` writes half the file and fails;
* ``save_once``: the first attempt of the ``FAIL_AT``-th checkpoint write fails part-way (fairseq retries);
* ``save_always``: every attempt of the ``FAIL_AT``-th checkpoint write fails part-way.
"""
import errno
import os
import shutil

import torch
from fairseq_cli import train

MODE, AT = os.environ["FAIL_MODE"], int(os.environ.get("FAIL_AT", "2"))
_copyfile, _save = shutil.copyfile, torch.save
_copies_to_last, _written = [0], []


def _disk_full():
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def copyfile(src, dst, *args, **kwargs):
    if MODE == "copy_last" and os.path.basename(dst).startswith("checkpoint_last"):
        _copies_to_last[0] += 1
        if _copies_to_last[0] == AT:
            with open(src, "rb") as f, open(dst, "wb") as g:
                data = f.read()
                g.write(data[: len(data) // 2])
            raise _disk_full()
    return _copyfile(src, dst, *args, **kwargs)


def save(obj, f, *args, **kwargs):
    name = getattr(f, "name", None)
    if MODE.startswith("save") and isinstance(name, str) and name.endswith(".pt.tmp"):
        if not _written or _written[-1][0] != name:
            _written.append([name, 0])
        _written[-1][1] += 1  # attempts at this file
        if len(_written) == AT and (MODE == "save_always" or _written[-1][1] == 1):
            f.write(b"\0" * 4096)
            raise _disk_full()
    return _save(obj, f, *args, **kwargs)


shutil.copyfile, torch.save = copyfile, save

if __name__ == "__main__":
    train.cli_main()
