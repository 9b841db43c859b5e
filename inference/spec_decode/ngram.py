"""N-gram prompt lookup: no second model. The last n tokens of a request are looked up earlier in
its own tokens (prompt and output); what followed the latest earlier occurrence is the guess.
Strong when the answer copies from its context: code edits, RAG answers quoting an article."""
from __future__ import annotations

import numpy as np


class NgramProposer:
    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n

    def propose(self, token_ids: list[int], k: int) -> list[int]:
        """Up to k tokens that followed the longest (n from max_n down to min_n) earlier match of
        the last n tokens; [] when none matches."""
        num = len(token_ids)
        if k <= 0 or num <= self.min_n:
            return []
        arr = np.asarray(token_ids, dtype=np.int64)
        for n in range(min(self.max_n, num - 1), self.min_n - 1, -1):
            suffix = arr[num - n:]
            # windows starting at 0..num-n-1: each is followed by at least one token
            windows = np.lib.stride_tricks.sliding_window_view(arr[:num - 1], n)    # [num - n, n]
            hits = np.flatnonzero((windows == suffix).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n            # the latest occurrence: nearest context wins
                return arr[start:start + k].tolist()
        return []
