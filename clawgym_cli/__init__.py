"""The app layer: the ``clawgym`` command line, the only package that imports every other one.

Layers, each importing only those below it::

    clawgym_cli                       (this package: commands)
    trainers, leaderboards            (consumers: training, evaluation reports)
    tasks, harness_adapters           (plugins: task sources, graders, harness adapters)
    clawgym_env                       (the engine: seam types, sandboxes, proxy, policies, capture)
"""
