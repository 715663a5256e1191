"""A nemesis test in the manner of Jepsen: clients in their own processes record every
operation while faults are injected, and a checker judges the history at the end.

- ``workload``: the tensors, and how an accumulate's value names its operation;
- ``history``: the records (invocations, completions, faults) and their files;
- ``workers``: the client, monitor and final-copy processes (run in a namespace);
- ``faults``: the seeded schedule of faults and the nemesis that applies them;
- ``checker``: what must hold of a history and the final copies;
- ``run``: one run end to end (cluster, workers, nemesis, heal, check), shared by
  ``tests/test_nemesis.py`` and ``bench/nemesis.py``.
"""
