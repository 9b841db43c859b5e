"""Fixtures shared by the kernel tests."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture
def nan_filled_empty():
    """torch.empty returns NaN-filled memory, so an output element a kernel never writes fails."""
    was_on = torch.are_deterministic_algorithms_enabled()
    was_warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    was_filling = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    yield
    torch.utils.deterministic.fill_uninitialized_memory = was_filling
    torch.use_deterministic_algorithms(was_on, warn_only=was_warn_only)
