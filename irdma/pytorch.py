"""Kept for code written before ``irdma.torch``: the same state-dict helpers and
``ParameterServerOptimizer``, now at home in ``irdma.torch`` (``irdma/torch/state.py``)."""

from irdma.torch.state import ParameterServerOptimizer, pull_state_dict, push_state_dict

__all__ = ["ParameterServerOptimizer", "pull_state_dict", "push_state_dict"]
