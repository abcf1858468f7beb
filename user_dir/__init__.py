"""fairseq-struct: five Transformer variants from the literature as a fairseq ``--user-dir``.

``--user-dir user_dir`` (or ``import user_dir``) registers every model, task
and criterion of the plugin and makes torch ≥ 2.6's weights-only checkpoint
loading accept the checkpoints ``fairseq-train`` writes (see
:mod:`user_dir.checkpoint_safety`) and fixes fairseq bugs that lose data, and tells
models built to load a checkpoint so (:mod:`user_dir.fairseq_fixes`).
"""
from . import checkpoint_safety, fairseq_fixes

checkpoint_safety.install()
fairseq_fixes.install()

from . import modules  # noqa: E402,F401
from . import criterions  # noqa: E402,F401
from . import tasks  # noqa: E402,F401
from . import models  # noqa: E402,F401
