"""Build the plugin's (and fairseq's) models in-process from ``fairseq-train`` flags, without data.

For parameter counts, speed measurements and tests: ``build("capsule_transformer", ["--routing-iters", 3])``
gives the model ``fairseq-train --arch capsule_transformer --routing-iters 3`` would train, over a dictionary
of placeholder symbols.
"""
from types import SimpleNamespace

import torch
from fairseq import models, options
from fairseq.data import Dictionary
from fairseq.dataclass.utils import convert_namespace_to_omegaconf


def toy_dictionary(size=40):
    """A fairseq dictionary with ``size`` symbols besides the four specials."""
    d = Dictionary()
    for i in range(size):
        d.add_symbol(f"w{i}")
    d.finalize(padding_factor=1)
    return d


def parse_cfg(arch, task="translation", extra=()):
    """The config ``fairseq-train`` would build for these flags (data path is a dummy)."""
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser, ["/nonexistent", "--task", task, "--arch", arch, "--cpu", *map(str, extra)]
    )
    return convert_namespace_to_omegaconf(args)


def build(arch, extra=(), task="translation", dictionary=None, seed=0, **task_attrs):
    """Builds ``arch`` for a fake task whose dictionaries are ``dictionary``."""
    dictionary = dictionary or toy_dictionary()
    cfg = parse_cfg(arch, task, extra)
    fake_task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary,
                                dictionary=dictionary, output_dictionary=dictionary, cfg=cfg.task,
                                args=cfg.task, **task_attrs)
    torch.manual_seed(seed)
    model = models.build_model(cfg.model, fake_task)
    return model.eval(), dictionary


def random_sentences(dictionary, lengths, seed=0, bos_eos=True):
    """Random token sentences (no specials inside), each ending in EOS."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        toks = torch.randint(dictionary.nspecial, len(dictionary), (n,), generator=g)
        if bos_eos:
            toks = torch.cat([toks, torch.tensor([dictionary.eos()])])
        out.append(toks)
    return out
