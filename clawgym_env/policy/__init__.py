"""Policy backends behind the serving proxy (token ids in → token ids + logprobs out)."""

from clawgym_env.policy.base import Generation, GenerationContext, PolicyBackend, SamplingParams

__all__ = ["Generation", "GenerationContext", "PolicyBackend", "SamplingParams"]
