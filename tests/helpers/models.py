"""Build plugin and fairseq models in-process from command-line style flags (:mod:`user_dir.from_flags`)."""
import torch

from user_dir.from_flags import build, parse_cfg, random_sentences, toy_dictionary  # noqa: F401


def prev_output(sentence, eos):
    """fairseq's prev_output_tokens for a target: EOS, then the target without its EOS."""
    return torch.cat([torch.tensor([eos]), sentence[:-1]])
