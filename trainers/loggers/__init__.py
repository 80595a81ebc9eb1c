"""Experiment trackers of the training runs, behind the :class:`~clawgym_env.loggers.Logger` seam.

* :mod:`trainers.loggers.args`: the ``log:`` section of every algorithm's config (:class:`LogArgs`);
* :mod:`trainers.loggers.tensorboard_logger`: ``tensorboard``, event files under ``<out_dir>/tb``;
* :mod:`trainers.loggers.wandb_logger`: ``wandb``, Weights & Biases (online, or offline into ``<out_dir>/wandb``).

The metrics file itself (``jsonl``, always on) and the fan-out to the trackers are
:class:`trainers.metrics.JsonlLogger` and :class:`trainers.metrics.MetricsLogger`. Each tracker is an entry point of
group ``clawgym.loggers`` and imports its package (``torch.utils.tensorboard``, ``wandb``) only when opened.
"""
