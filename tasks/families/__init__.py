"""Generated task families: small, parameterised task sets in the ClawGym task-dir format.

A family is a generator (one module here) that writes task dirs into split folders, each split a
suite on its own (``load_suite(path)``). The generated folders are committed next to the module so
they can be read, run and graded without regenerating; regenerating with the same arguments writes
byte-identical files.
"""
