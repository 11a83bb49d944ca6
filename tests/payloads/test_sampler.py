"""The sampler picks by request id: the same ids every time, about the rate's share of
them, and every error while SERVING_PAYLOAD_LOG_ERRORS is on."""

from __future__ import annotations

import hashlib

import pytest

from serving_core.payloads.sampler import Sampler, fraction

IDS = [f"req-{n}" for n in range(4000)]


def expected_fraction(request_id: str) -> float:
    # The documented rule, written out again: the first 8 bytes of SHA-256, big-endian.
    return int(hashlib.sha256(request_id.encode()).hexdigest()[:16], 16) / 2**64


def test_the_fraction_is_the_first_eight_bytes_of_the_ids_sha256():
    for request_id in IDS[:50]:
        assert fraction(request_id) == expected_fraction(request_id)
        assert 0.0 <= fraction(request_id) < 1.0


@pytest.mark.parametrize("rate", [0.01, 0.25, 0.5, 0.9])
def test_a_rate_picks_exactly_the_ids_under_it_and_about_its_share(rate):
    sampler = Sampler(rate)
    picked = {request_id for request_id in IDS if sampler.picks(request_id)}
    assert picked == {request_id for request_id in IDS if expected_fraction(request_id) < rate}
    # Deterministic, so no flake: 4,000 fixed ids land within 10% of the rate's share.
    assert abs(len(picked) - rate * len(IDS)) <= 0.1 * rate * len(IDS) + 5


def test_the_same_id_is_picked_the_same_way_by_every_sampler():
    assert [Sampler(0.3).picks(i) for i in IDS] == [Sampler(0.3).picks(i) for i in IDS]


def test_rate_zero_picks_no_answer_and_rate_one_picks_every_one():
    assert not any(Sampler(0.0).picks(i) for i in IDS)
    assert all(Sampler(1.0).picks(i) for i in IDS)


def test_every_error_is_picked_while_errors_are_on_whatever_the_rate():
    assert all(Sampler(0.0, errors=True).picks(i, failed=True) for i in IDS)


def test_with_errors_off_an_error_is_sampled_as_an_answer_is():
    sampler = Sampler(0.25, errors=False)
    assert [sampler.picks(i, failed=True) for i in IDS] == [sampler.picks(i) for i in IDS]
    assert not any(Sampler(0.0, errors=False).picks(i, failed=True) for i in IDS)
