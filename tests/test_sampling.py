"""The training stream is drawn per micro-batch, so any process layout trains on the same batches (issue #17)."""

from __future__ import annotations

import itertools

import torch

from benchmark.data.sampling import SHUFFLE, SeededMasking, StageMicroBatches, derived_seed, seeded
from benchmark.families import MASKED_LM


def _take(sampler, n):
    return list(itertools.islice(iter(sampler), n))


def test_two_processes_take_alternate_micro_batches_of_the_one_process_stream():
    one = _take(StageMicroBatches(size=10, micro=3, seed=7, stage=1), 8)
    rank0 = _take(StageMicroBatches(size=10, micro=3, seed=7, stage=1, rank=0, world=2), 4)
    rank1 = _take(StageMicroBatches(size=10, micro=3, seed=7, stage=1, rank=1, world=2), 4)
    assert one[0::2] == rank0 and one[1::2] == rank1
    assert [batch[0][0] for batch in one] == list(range(8))  # every micro-batch carries its global index


def test_each_epoch_is_a_fresh_permutation_cut_into_full_micro_batches():
    batches = _take(StageMicroBatches(size=10, micro=3, seed=7, stage=0), 6)  # 3 per epoch: one example dropped
    first, second = ([i for batch in batches[e * 3 : e * 3 + 3] for _, _, i in batch] for e in (0, 1))
    assert len(set(first)) == len(first) == 9 and len(set(second)) == 9 and first != second
    assert all(len(batch) == 3 for batch in batches)
    generator = torch.Generator().manual_seed(derived_seed(7, 0, SHUFFLE, 0))
    assert first == torch.randperm(10, generator=generator).tolist()[:9]


def test_a_tiny_dataset_gives_one_short_micro_batch_per_epoch():
    batches = _take(StageMicroBatches(size=2, micro=8, seed=1, stage=0), 3)
    assert [len(b) for b in batches] == [2, 2, 2]


def test_streams_differ_by_seed_and_stage():
    base = _take(StageMicroBatches(size=50, micro=5, seed=1, stage=0), 3)
    assert base != _take(StageMicroBatches(size=50, micro=5, seed=2, stage=0), 3)
    assert base != _take(StageMicroBatches(size=50, micro=5, seed=1, stage=1), 3)


class _Tokenizer:
    mask_token_id = 1

    def __len__(self):
        return 100


def _chunks(n):
    g = torch.Generator().manual_seed(0)
    return [
        {
            "input_ids": torch.randint(5, 100, (32,), generator=g),
            "special_tokens_mask": torch.zeros(32, dtype=torch.long),
        }
        for _ in range(n)
    ]


def test_masks_depend_on_the_micro_batch_index_alone():
    chunks = _chunks(4)
    collate = SeededMasking(_Tokenizer(), 0.15, seed=3, stage=2, family=MASKED_LM)
    _, first = collate([(5, c) for c in chunks])
    torch.rand(1000)  # the global RNG moves: masks do not
    _, other = collate([(6, c) for c in chunks])
    _, again = collate([(5, c) for c in chunks])
    assert torch.equal(first["input_ids"], again["input_ids"]) and torch.equal(
        first["mlm_positions"], again["mlm_positions"]
    )
    assert not torch.equal(first["input_ids"], other["input_ids"])


def test_seeded_block_draws_from_its_seed_and_restores_the_global_rng():
    dropout = torch.nn.Dropout(0.5)
    x = torch.ones(64)
    torch.manual_seed(0)
    with seeded(11, torch.device("cpu")):
        a = dropout(x)
    after = torch.rand(3)
    torch.manual_seed(0)
    torch.rand(50)  # another history before the block
    with seeded(11, torch.device("cpu")):
        b = dropout(x)
    assert torch.equal(a, b)
    torch.manual_seed(0)
    assert torch.equal(torch.rand(3), after)  # the block left the global RNG where it was
