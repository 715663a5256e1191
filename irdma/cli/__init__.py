"""The ``irdma`` command: every subcommand's module, none of which the library imports.

- ``main``: the parser and dispatch (the ``irdma`` script and ``python -m irdma``)
- ``boundary``: how the command ends (Ctrl-C 130, closed pipe, one line per error)
- ``tensorcmds``: put, get, cp, mv, ls, stat, rm; ``tensorfiles``: .npy, .npz,
  .safetensors, ``-`` and ``DIR/`` as those commands read and write them
- ``local``: ``irdma local``; ``localdir``: its directory (lock, ports, data,
  secret); ``supervisor``: its restarts of dead daemons
- ``status``, ``doctor``, ``bench``, ``drain``: the commands of those names

``irdma mount`` comes from ``irdma_fuse`` (entry point ``irdma.commands``).
"""
