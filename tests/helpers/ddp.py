"""DDP readiness: a model trains under ``DistributedDataParallel`` exactly as in one process.

Usage from a test module::

    def ddp_setup():            # module-level, so spawned workers can import it
        torch.manual_seed(0)
        model = build_my_model()
        batches = [batch_for_rank0, batch_for_rank1]   # one per rank
        return model, batches, loss_fn               # loss_fn(model, batch) -> scalar

    def test_ddp():
        assert_ddp_matches_single_process("tests.test_mine:ddp_setup")

Two gloo processes wrap the model in DDP (``find_unused_parameters=False``,
as fairseq's default) and take ``steps`` SGD steps, each rank on its own batch.
The reference takes the same steps in one process with the gradients averaged
over the batches.  Parameters must agree.  Taking two steps also catches
parameters that get no gradient: DDP then fails on the second step.
"""
import importlib
import os
import socket
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD_SIZE = 2


def _load(setup_path):
    module, name = setup_path.split(":")
    return getattr(importlib.import_module(module), name)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, setup_path, port, steps, lr, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    try:
        model, batches, loss_fn = _load(setup_path)()
        ddp = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=False)
        opt = torch.optim.SGD(ddp.parameters(), lr=lr)
        for _ in range(steps):
            opt.zero_grad()
            loss_fn(ddp, batches[rank]).backward()
            opt.step()
        if rank == 0:
            torch.save({k: v.detach().clone() for k, v in model.state_dict().items()},
                       os.path.join(out_dir, "ddp.pt"))
        # Tear down in step: free DDP's reducer (it holds the process group) and let both
        # ranks reach the barrier before the group goes.  Without this, a rank that leaves
        # first can abort in gloo's teardown ("terminate called without an active exception").
        del ddp, opt
        dist.barrier()
    finally:
        dist.destroy_process_group()


def single_process_reference(setup_path, steps=2, lr=0.1):
    model, batches, loss_fn = _load(setup_path)()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        for batch in batches[:WORLD_SIZE]:
            (loss_fn(model, batch) / WORLD_SIZE).backward()
        opt.step()
    return model.state_dict()


def assert_ddp_matches_single_process(setup_path, steps=2, lr=0.1, atol=1e-5):
    """Asserts that DDP training on 2 gloo/CPU ranks equals single-process training."""
    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(_worker, args=(setup_path, _free_port(), steps, lr, out_dir), nprocs=WORLD_SIZE, join=True)
        ddp_state = torch.load(os.path.join(out_dir, "ddp.pt"))
    ref_state = single_process_reference(setup_path, steps, lr)
    assert ddp_state.keys() == ref_state.keys()
    changed = 0
    for name, ref in ref_state.items():
        got = ddp_state[name]
        if not torch.is_floating_point(ref):
            continue
        assert torch.allclose(got, ref, atol=atol, rtol=1e-4), (
            f"{name}: DDP and single-process parameters differ by {(got - ref).abs().max().item():.3g}"
        )
        changed += 1
    assert changed > 0, "no floating-point parameters compared"


def translation_batches_and_loss(model, dictionary):
    """``(model, batches, loss_fn)`` for an encoder-decoder: one random batch per rank, token cross-entropy.

    A ready-made return value for a test module's ``ddp_setup``.
    """
    from tests.helpers.models import prev_output, random_sentences

    model.train()
    batches = []
    for seed in range(1, WORLD_SIZE + 1):
        src = torch.stack(random_sentences(dictionary, [5, 5], seed=seed))
        tgt = torch.stack(random_sentences(dictionary, [4, 4], seed=seed + 10))
        prev = torch.stack([prev_output(t, dictionary.eos()) for t in tgt])
        batches.append((src, torch.tensor([src.size(1)] * src.size(0)), prev, tgt))

    def loss_fn(m, batch):
        src, lengths, prev, target = batch
        logits = m(src, lengths, prev)[0]
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1))

    return model, batches, loss_fn
