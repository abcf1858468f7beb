"""What kind of model a task trains, so that an ``--arch`` given a ``--task`` of another kind (a
language model on translation data, a translation model on a classification task) stops with one
clear error at ``build_model`` instead of a traceback from inside fairseq or torch.

Tasks of no kind listed here (other fairseq or user tasks) are let through.
"""
from fairseq.tasks import TASK_REGISTRY
from fairseq.tasks.language_modeling import LanguageModelingTask
from fairseq.tasks.sentence_prediction import SentencePredictionTask
from fairseq.tasks.translation import TranslationTask


def _kinds():
    """kind: (the models of that kind, the task classes that train them, the tasks to suggest)."""
    from .bptt_lm import BPTTLanguageModelingTask
    from .masked_summation import MaskedSummationTask
    from .sequence_tagging import SequenceTaggingTask

    return {
        "translation": ("sequence-to-sequence models", (TranslationTask,), "translation"),
        "lm": ("language models", (LanguageModelingTask, BPTTLanguageModelingTask), "language_modeling or bptt_lm"),
        "classification": ("encoders for classification, tagging or regression",
                           (SentencePredictionTask, SequenceTaggingTask, MaskedSummationTask),
                           "sentence_prediction, sentence_pair_classification, sequence_tagging or "
                           "masked_summation"),
    }


def check_task_kind(kind: str, cfg, task) -> None:
    """Raises ``ValueError`` when ``task`` trains another kind of model than ``kind`` (see :func:`_kinds`)."""
    kinds = _kinds()
    for other, (_, classes, _) in kinds.items():
        if other != kind and isinstance(task, classes):
            arch = getattr(cfg, "arch", None) or getattr(cfg, "_name", None)
            task_name = next((n for n, c in TASK_REGISTRY.items() if type(task) is c), type(task).__name__)
            raise ValueError(f"--arch {arch} is one of the {kinds[kind][0]}, but --task {task_name} trains "
                             f"{kinds[other][0]}: use --task {kinds[kind][2]}")
