"""``fairseq-train`` that kills itself with SIGKILL right after saving the checkpoint of update
``$KILL_AT_UPDATE``: a hard kill (no cleanup, no final save), as a preempted job or the OOM killer.

    KILL_AT_UPDATE=3 python tests/helpers/train_then_kill.py DATA --user-dir user_dir ... (fairseq-train's flags)
"""
import os
import signal

from fairseq import checkpoint_utils
from fairseq_cli import train

KILL_AT = int(os.environ["KILL_AT_UPDATE"])
_save_checkpoint = checkpoint_utils.save_checkpoint


def save_then_kill(cfg, trainer, epoch_itr, val_loss):
    saved = _save_checkpoint(cfg, trainer, epoch_itr, val_loss)
    if trainer.get_num_updates() == KILL_AT:
        os.kill(os.getpid(), signal.SIGKILL)
    return saved


# fairseq_cli.train calls checkpoint_utils.save_checkpoint, whose own body (and load_checkpoint) keep the best
# score on the module-level name: replacing it keeps that bookkeeping on one function.
checkpoint_utils.save_checkpoint = save_then_kill

if __name__ == "__main__":
    train.cli_main()
