"""The environments users call: the Gymnasium ``ClawGymEnv`` and the ``Runtime`` that runs episodes (locally or on a
Ray fleet)."""
