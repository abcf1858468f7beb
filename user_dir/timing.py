"""Timing for the speed benchmarks: on CPU the process's CPU time (robust to other jobs on the machine), on a GPU
the wall clock once the queued work has finished."""
import re
import time

import torch


def device_from_flag(parser, value):
    """``torch.device`` for a ``--device`` flag (``cpu``, ``cuda`` or ``cuda:N``); a clear parser error otherwise."""
    if not re.fullmatch(r"cpu|cuda(:\d+)?", value):
        parser.error(f"--device {value}: cpu, cuda or cuda:N")
    if value.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {value}: torch sees no GPU here (torch.cuda.is_available() is False)")
    return torch.device(value)


def clock(device):
    """Seconds: CPU time on CPU; on a GPU the wall clock after synchronising ``device``."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return time.perf_counter()
    return time.process_time()


def timing_name(device, threads=None):
    """How ``clock(device)`` measures, in words for a results file: ``CPU time`` (``, one thread`` / ``, N threads``
    when ``threads`` is given) or ``wall time on cuda:0, synchronised``."""
    if device.type == "cuda":
        return f"wall time on {device}, synchronised"
    return "CPU time" + ("" if threads is None else ", one thread" if threads == 1 else f", {threads} threads")
