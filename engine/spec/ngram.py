"""The n-gram (prompt lookup) proposer: proposes what followed the request's own latest suffix the last time it
occurred.

`propose(token_ids, k)`, on the request's prompt + output so far:
1. find the longest suffix of `token_ids`, at most `prompt_lookup_max` tokens long, that also occurs earlier in
   `token_ids` (an occurrence that ends before the last token; it may overlap the suffix itself);
2. if it is shorter than `prompt_lookup_min`, propose nothing;
3. else propose the (up to) k tokens that followed its MOST RECENT earlier occurrence; fewer when that occurrence
   is followed by fewer than k tokens.

NOTE: the most recent occurrence, not the first: the text being copied is usually the one nearest in the context
(the output repeating a line it just wrote, an edit walking down the code it quotes), and a longer-ago occurrence
of a short n-gram is more often a coincidence. vLLM's prompt-lookup proposer makes the same choice.

Vectorised: one comparison over the whole context finds every earlier occurrence of the last token, then each
step back compares only the candidates still matching, so a call costs a few numpy operations on short arrays.
"""

from __future__ import annotations

import numpy as np

_EMPTY = np.zeros(0, dtype=np.int64)


class NgramProposer:
    def __init__(self, prompt_lookup_min: int, prompt_lookup_max: int) -> None:
        if prompt_lookup_min < 1:
            raise ValueError(f"prompt_lookup_min must be >= 1, got {prompt_lookup_min}")
        if prompt_lookup_max < prompt_lookup_min:
            raise ValueError(f"prompt_lookup_max must be >= prompt_lookup_min, got {prompt_lookup_max}")
        self.prompt_lookup_min = prompt_lookup_min
        self.prompt_lookup_max = prompt_lookup_max

    def propose(self, token_ids: np.ndarray, k: int) -> np.ndarray:
        num_tokens = len(token_ids)
        if k <= 0 or num_tokens <= self.prompt_lookup_min:
            return _EMPTY
        # Candidates are the positions where an earlier occurrence of the suffix ends (ascending).
        ends = np.flatnonzero(token_ids[:-1] == token_ids[-1])
        match_len = 1
        while ends.size and match_len < self.prompt_lookup_max:
            longer = ends[ends >= match_len]
            longer = longer[token_ids[longer - match_len] == token_ids[num_tokens - 1 - match_len]]
            if not longer.size:
                break
            ends, match_len = longer, match_len + 1
        if not ends.size or match_len < self.prompt_lookup_min:
            return _EMPTY
        start = int(ends[-1]) + 1
        return np.asarray(token_ids[start : start + k], dtype=np.int64)
