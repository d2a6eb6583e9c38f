import math
from collections import Counter
from collections.abc import Sequence

import pytest
import torch

from common.sampling_params import SamplingParams
from engine.sampler import (
    Sampler,
    SamplingBatch,
    apply_penalties,
    apply_top_k_top_p_min_p,
    position_seed,
)

PROBS = [0.5, 0.3, 0.15, 0.05]
NEG_INF = float("-inf")


def make_batch(
    params: list[SamplingParams],
    seeds: list[int | None] | None = None,
    prompts: list[Sequence[int]] | None = None,
    outputs: list[Sequence[int]] | None = None,
) -> SamplingBatch:
    return SamplingBatch(
        params=params,
        seeds=seeds if seeds is not None else [None] * len(params),
        positions=[0] * len(params),
        prompt_token_ids=prompts if prompts is not None else [[] for _ in params],
        output_token_ids=outputs if outputs is not None else [[] for _ in params],
    )


def filter_one(probs: list[float], top_k: int = 4, top_p: float = 1.0, min_p: float = 0.0) -> set[int]:
    logits = torch.tensor([probs]).log()
    masked = apply_top_k_top_p_min_p(logits, torch.tensor([top_k]), torch.tensor([top_p]), torch.tensor([min_p]))
    kept = {i for i, value in enumerate(masked[0].tolist()) if value != NEG_INF}
    assert torch.equal(masked[0, sorted(kept)], logits[0, sorted(kept)])
    return kept


@pytest.mark.parametrize(
    ("top_k", "top_p", "min_p", "kept"),
    [
        (4, 1.0, 0.0, {0, 1, 2, 3}),
        (2, 1.0, 0.0, {0, 1}),
        (1, 1.0, 0.0, {0}),
        (4, 0.8, 0.0, {0, 1}),
        (4, 0.81, 0.0, {0, 1, 2}),
        (4, 0.5, 0.0, {0}),
        (4, 0.51, 0.0, {0, 1}),
        (4, 0.95, 0.0, {0, 1, 2}),
        (4, 0.96, 0.0, {0, 1, 2, 3}),
        (4, 1e-9, 0.0, {0}),
        (4, 1.0, 0.2, {0, 1, 2}),
        (4, 1.0, 0.31, {0, 1}),
        (4, 1.0, 1.0, {0}),
        (3, 0.84, 0.0, {0, 1}),
        (3, 0.9, 0.0, {0, 1, 2}),
        (2, 0.8, 0.5, {0, 1}),
    ],
)
def test_filters_keep_exact_sets(top_k: int, top_p: float, min_p: float, kept: set[int]) -> None:
    assert filter_one(PROBS, top_k, top_p, min_p) == kept


@pytest.mark.parametrize("num_kept", range(1, 11))
def test_top_p_at_an_exact_prefix_mass_ignores_rounding(num_kept: int) -> None:
    # float32 cumsum of ten 0.1s overshoots or undershoots k/10 depending on k.
    assert filter_one([0.1] * 10, top_k=10, top_p=num_kept / 10) == set(range(num_kept))


def test_top_p_one_keeps_a_negligible_tail() -> None:
    tail = [1.0, 1e-9, 1e-9, 1e-30]
    assert filter_one(tail, top_k=4, top_p=1.0) == {0, 1, 2, 3}
    assert filter_one(tail, top_k=4, top_p=0.999) == {0}


def test_top_p_renormalizes_after_top_k() -> None:
    # After top_k=2 the masses are 0.625 / 0.375: top_p=0.6 keeps only the first.
    assert filter_one(PROBS, top_k=2, top_p=0.6) == {0}
    assert filter_one(PROBS, top_k=2, top_p=0.63) == {0, 1}


def test_filters_are_per_row_and_order_independent() -> None:
    perm = [2, 0, 3, 1]
    logits = torch.tensor([PROBS, [PROBS[i] for i in perm], PROBS]).log()
    masked = apply_top_k_top_p_min_p(
        logits, torch.tensor([2, 4, 4]), torch.tensor([1.0, 0.8, 1.0]), torch.tensor([0.0, 0.0, 0.2])
    )
    kept = [[i for i, v in enumerate(row) if v != NEG_INF] for row in masked.tolist()]
    assert kept == [[0, 1], [1, 3], [0, 1, 2]]


def test_greedy_is_argmax_and_ignores_filters() -> None:
    logits = torch.tensor([[0.1, 2.0, -1.0, 1.9], [5.0, 0.0, 0.0, 0.0], [-3.0, -2.0, -2.5, -9.0]])
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.0, top_k=1, min_p=0.5),
        SamplingParams(temperature=0.0, top_p=0.1),
    ]
    out = Sampler()(logits, make_batch(params)).to_lists()
    assert out[0] == [1, 0, 1]
    assert out[1] == [None, None, None]


def test_greedy_accepts_half_precision_logits() -> None:
    logits = torch.tensor([[0.5, 3.0, 1.0]], dtype=torch.bfloat16)
    out = Sampler()(logits, make_batch([SamplingParams(temperature=0.0, logprobs=True)])).to_lists()
    assert out[0] == [1]
    expected = torch.log_softmax(logits.float(), dim=1)[0, 1].item()
    assert out[1] == [expected]


def draw_sequence(
    logits_row: torch.Tensor, params: SamplingParams, seed: int, steps: int, position: int, others: list[SamplingParams]
) -> list[int]:
    """Sample `steps` tokens for one seeded row placed at `position` among `others`."""
    sampler = Sampler()
    other_seeds = [None if p.greedy else 100 + i for i, p in enumerate(others)]
    vocab_size = logits_row.shape[0]
    tokens: list[int] = []
    for step in range(steps):
        noise = torch.Generator().manual_seed(step)
        rows = [torch.randn(vocab_size, generator=noise) for _ in others]
        rows.insert(position, logits_row)
        all_params = list(others)
        all_params.insert(position, params)
        seeds: list[int | None] = list(other_seeds)
        seeds.insert(position, seed)
        positions = [step] * len(all_params)
        batch = SamplingBatch(all_params, seeds, positions, [[] for _ in all_params], [[] for _ in all_params])
        tokens.append(sampler(torch.stack(rows), batch).to_lists()[0][position])
    return tokens


def test_same_seed_same_tokens_alone_or_in_any_batch() -> None:
    logits_row = torch.randn(64, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, min_p=0.01, seed=7)
    alone = draw_sequence(logits_row, params, seed=7, steps=30, position=0, others=[])
    assert alone == draw_sequence(logits_row, params, seed=7, steps=30, position=0, others=[])
    others = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.3, top_p=0.5),
        SamplingParams(temperature=0.7, top_k=3, min_p=0.2),
    ]
    for position in range(len(others) + 1):
        assert draw_sequence(logits_row, params, seed=7, steps=30, position=position, others=others) == alone
    assert len(set(alone)) > 3


def test_position_seeds_are_pinned_63_bit_values() -> None:
    # NOTE: pinned: changing the mix changes every seeded request's tokens.
    assert [position_seed(0, 0), position_seed(1234, 7), position_seed(1234, 8), position_seed(-5, 3)] == [
        3119036373970289394,
        5952960657694147797,
        7490526303529369106,
        5114786405218029739,
    ]


def test_a_seeded_draw_depends_on_its_seed_and_position_only() -> None:
    """What a migrated request relies on: sampling from position 10 on, with nothing drawn before, gives the same
    tokens as the uninterrupted run gives from position 10 on."""
    logits = torch.randn(1, 64, generator=torch.Generator().manual_seed(4))
    params = SamplingParams(temperature=1.0, seed=99)

    def at(position: int) -> int:
        batch = SamplingBatch([params], [99], [position], [[]], [[]])
        return Sampler()(logits, batch).to_lists()[0][0]

    uninterrupted = [at(position) for position in range(30)]
    assert [at(position) for position in range(10, 30)] == uninterrupted[10:]
    assert len(set(uninterrupted)) > 5


def test_different_seeds_differ() -> None:
    logits_row = torch.zeros(100)
    params = SamplingParams(temperature=1.0)
    first = draw_sequence(logits_row, params, seed=1, steps=50, position=0, others=[])
    second = draw_sequence(logits_row, params, seed=2, steps=50, position=0, others=[])
    assert first != second
    assert sum(a == b for a, b in zip(first, second, strict=True)) < 10


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        (SamplingParams(temperature=1.0), PROBS),
        (SamplingParams(temperature=1.0, top_k=2), [0.625, 0.375, 0.0, 0.0]),
        (SamplingParams(temperature=1.0, min_p=0.2), [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0]),
        (SamplingParams(temperature=0.5), [p * p / sum(q * q for q in PROBS) for p in PROBS]),
    ],
)
def test_empirical_frequencies(params: SamplingParams, expected: list[float]) -> None:
    num_draws = 8000
    logits = torch.tensor([PROBS]).log().expand(num_draws, -1)
    empty: list[Sequence[int]] = [[] for _ in range(num_draws)]
    seeds: list[int | None] = list(range(1234, 1234 + num_draws))
    batch = SamplingBatch([params] * num_draws, seeds, [0] * num_draws, empty, empty)
    counts = Counter(Sampler()(logits, batch).to_lists()[0])
    for token_id, probability in enumerate(expected):
        if probability == 0.0:
            assert counts[token_id] == 0
        else:
            assert abs(counts[token_id] / num_draws - probability) < 0.02


def test_penalties_change_exactly_the_right_logits() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, -2.0, 0.0], [2.0, -1.0, 0.5, 3.0, -2.0, 0.0]])
    penalized = apply_penalties(
        logits,
        prompt_token_ids=[[0, 1], [0]],
        output_token_ids=[[2, 2, 2, 4], [1, 1]],
        repetition_penalties=torch.tensor([2.0, 1.0]),
        presence_penalties=torch.tensor([0.25, 0.5]),
        frequency_penalties=torch.tensor([0.5, -0.25]),
    )
    # Row 0: repetition over {0, 1, 2, 4}, then presence/frequency over outputs {2: 3, 4: 1}.
    # Row 1: repetition 1.0 is a no-op; outputs {1: 2} -> -1 - 0.5 - (-0.25 * 2).
    assert penalized.tolist() == [
        [1.0, -2.0, 0.25 - 0.25 - 1.5, 3.0, -4.0 - 0.25 - 0.5, 0.0],
        [2.0, -1.0 - 0.5 + 0.5, 0.5, 3.0, -2.0, 0.0],
    ]
    assert logits.tolist()[0] == [2.0, -1.0, 0.5, 3.0, -2.0, 0.0]


def test_sampler_applies_penalties_before_greedy() -> None:
    logits = torch.tensor([[3.0, 2.0, 1.0], [3.0, 2.0, 1.0], [3.0, 2.0, 1.0]])
    params = [
        SamplingParams(temperature=0.0, repetition_penalty=2.0),
        SamplingParams(temperature=0.0, frequency_penalty=2.0),
        SamplingParams(temperature=0.0, presence_penalty=2.0),
    ]
    out = Sampler()(logits, make_batch(params, prompts=[[0], [0], [1]], outputs=[[], [0], [0, 0]])).to_lists()
    # 3/2 < 2; 3 - 2 < 2; 3 - 2 = 1 < 2 (presence counts once).
    assert out[0] == [1, 1, 1]


def test_logprobs_are_raw_log_softmax_at_sampled_ids() -> None:
    logits = torch.randn(4, 32, generator=torch.Generator().manual_seed(3))
    params = [
        SamplingParams(temperature=0.0, logprobs=True, repetition_penalty=1.5),
        SamplingParams(temperature=0.8, top_k=5, logprobs=True),
        SamplingParams(temperature=0.8),
        SamplingParams(temperature=1.2, top_p=0.5, logprobs=True, frequency_penalty=1.0),
    ]
    batch = make_batch(params, seeds=[None, 11, 12, 13], prompts=[[1, 2]] * 4, outputs=[[3]] * 4)
    out = Sampler()(logits, batch).to_lists()
    raw = torch.log_softmax(logits, dim=1)
    assert out[1][2] is None
    for row in (0, 1, 3):
        assert out[1][row] == raw[row, out[0][row]].item()
    assert math.isfinite(raw[1, out[0][1]].item())


def test_top_k_one_sampling_equals_greedy() -> None:
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(9))
    params = [SamplingParams(temperature=1.5, top_k=1, seed=i) for i in range(5)]
    out = Sampler()(logits, make_batch(params, seeds=list(range(5)))).to_lists()
    assert out[0] == logits.argmax(dim=1).tolist()


@pytest.mark.gpu
def test_cuda_matches_cpu_greedy_and_is_batch_independent() -> None:
    logits = torch.randn(6, 1000, generator=torch.Generator().manual_seed(5))
    greedy = [SamplingParams(temperature=0.0, repetition_penalty=1.3, frequency_penalty=0.5)] * 6
    prompts: list[Sequence[int]] = [list(range(row, row + 20)) for row in range(6)]
    outputs: list[Sequence[int]] = [[row, row + 1] for row in range(6)]
    on_cpu = Sampler()(logits, make_batch(greedy, prompts=prompts, outputs=outputs)).to_lists()
    on_cuda = Sampler()(logits.cuda(), make_batch(greedy, prompts=prompts, outputs=outputs)).to_lists()
    assert on_cuda[0] == on_cpu[0]

    params = SamplingParams(temperature=0.9, top_k=100, top_p=0.9, min_p=0.01)
    other = SamplingParams(temperature=1.1, top_p=0.7)

    def draw(num_others: int) -> list[int]:
        """Ten tokens of the row seeded 0, placed last after `num_others` other sampled rows."""
        seeds: list[int | None] = [*range(1, num_others + 1), 0]
        empty: list[Sequence[int]] = [[] for _ in seeds]
        noise = torch.randn(num_others, 1000, generator=torch.Generator().manual_seed(num_others))
        stacked = torch.cat([noise, logits[:1]]).cuda()
        tokens = []
        for position in range(10):
            batch = SamplingBatch([other] * num_others + [params], seeds, [position] * len(seeds), empty, empty)
            tokens.append(Sampler()(stacked, batch).to_lists()[0][-1])
        return tokens

    alone = draw(0)
    assert draw(3) == alone
    assert draw(40) == alone
    assert len(set(alone)) > 2
