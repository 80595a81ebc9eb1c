"""Evaluation runs, Pass@k, tables and pages."""
