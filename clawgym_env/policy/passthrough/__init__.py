"""A policy that forwards each call to an upstream OpenAI- or Anthropic-compatible API, with bounds."""
