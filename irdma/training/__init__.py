"""Training over the parameter server: how updates apply, and what workers call.

- ``modes``: the training modes a tensor is created with (async, sync, ssp,
  hybrid), the options they keep in its metadata, a worker's identity
- ``worker``: ``Worker``, one training process's pull and push per step
- ``collectives``: ``Group``, allreduce, broadcast and barrier among workers

``irdma.torch`` (PyTorch's optimizers, DDP hook and state dicts over these)
keeps its own top-level name, the one users import.

This ``__init__`` imports nothing: the client and the daemons use ``modes``,
while ``worker`` and ``collectives`` use the client, so naming them here would
make the client's import of ``modes`` import the client.
"""
