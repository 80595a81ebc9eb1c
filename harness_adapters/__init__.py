"""Harness adapters, one package per harness (``harness_adapters.<name>`` exports ``Adapter``)."""
