"""Example ClawGym plugins, each declared as an entry point in this package's ``pyproject.toml``.

* ``example-reinforce`` (``clawgym.algorithms``): :mod:`clawgym_example_plugins.reinforce`, REINFORCE with a
  group-mean baseline built on :mod:`trainers.api` alone;
* ``example-agent`` (``clawgym.harnesses``): :mod:`clawgym_example_plugins.harness`, a stdlib-only agent that
  speaks OpenAI chat completions to the serving proxy;
* ``example`` (``clawgym.suites``): :mod:`clawgym_example_plugins.suite`, two tasks and their loader;
* ``example-files`` (``clawgym.graders``): :mod:`clawgym_example_plugins.grader`, which the suite's tasks name
  in their ``data_entry.json``;
* ``example-turns`` (``clawgym.dialects``): :mod:`clawgym_example_plugins.dialect`, a JSON chat wire of its own,
  which the harness speaks with ``--harness-opt wire=example``.
"""
