"""The OpenAI Responses dialect (``POST /v1/responses``)."""
