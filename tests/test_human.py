"""sft_grid/core/human.py: the one way sft_grid writes counts, sizes, durations and GPU-hours for a person."""

from __future__ import annotations

from sft_grid.core.human import count, duration, hours, size


def test_sizes_are_decimal_as_the_hub_lists_them():
    assert [size(0), size(999), size(1000), size(1536), size(6 * 2**20)] == [
        "0 B",
        "999 B",
        "1 kB",
        "1.54 kB",
        "6.29 MB",
    ]
    assert [size(447_244_032 * 4), size(14e9), size(2.5e12), size(3e15)] == ["1.79 GB", "14 GB", "2.5 TB", "3 PB"]


def test_counts_carry_a_suffix_and_extremes_e_notation():
    assert [count(12), count(4500), count(1_234_567), count(7.1e9), count(2.2e12)] == [
        "12",
        "4.5k",
        "1.23M",
        "7.1B",
        "2.2T",
    ]
    assert [count(1e20), count(2.5e-5), count(0.25), count(0)] == ["1e+20", "2.5e-05", "0.25", "0"]


def test_durations_are_slurms_form():
    assert [duration(0), duration(59.6), duration(3723), duration(2 * 93600)] == [
        "00:00:00",
        "00:01:00",
        "01:02:03",
        "2-04:00:00",
    ]
    assert duration(None) == "?"


def test_gpu_hours_never_in_e_notation():
    assert [hours(0.012345), hours(4.567), hours(78.91), hours(1234.5), hours(None)] == [
        "0.0123",
        "4.57",
        "78.9",
        "1234",
        "?",
    ]
