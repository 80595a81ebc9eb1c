"""The Docker sandbox backend: containers, the in-container launcher, streams, files and a warm pool."""
