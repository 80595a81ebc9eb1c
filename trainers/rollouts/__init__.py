"""Drawing and running a step's episodes: synchronous, ahead of training (async), generation and evaluation."""
