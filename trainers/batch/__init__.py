"""From rollouts to training batches: groups and advantages, cleaning, call trees into bounded packs, logprobs."""
