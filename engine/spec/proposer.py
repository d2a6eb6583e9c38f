"""What a draft-token proposer is: prompt + output so far in, up to k proposed next tokens out."""

from __future__ import annotations

from typing import Protocol

import numpy as np


class Proposer(Protocol):
    def propose(self, token_ids: np.ndarray, k: int) -> np.ndarray:
        """Up to `k` proposed next tokens (int64, 1-D, may be empty) after `token_ids`: the request's prompt and
        output so far (int64, 1-D)."""
        ...
