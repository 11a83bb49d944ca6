from __future__ import annotations

import os

from serving_core.cores import cgroup_quota, usable_cores


def test_cgroup_v2_quota_is_read(tmp_path):
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cgroup_quota(tmp_path) == 1.5


def test_cgroup_v2_without_limit_is_none(tmp_path):
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_quota(tmp_path) is None


def test_cgroup_v1_quota_is_read(tmp_path):
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("300000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_quota(tmp_path) == 3.0


def test_a_quota_below_the_affinity_mask_bounds_the_cores(tmp_path):
    (tmp_path / "cpu.max").write_text("100000 100000\n")
    assert usable_cores(tmp_path) == 1


def test_a_fractional_quota_still_leaves_one_core(tmp_path):
    (tmp_path / "cpu.max").write_text("50000 100000\n")
    assert usable_cores(tmp_path) == 1


def test_without_cgroup_files_the_affinity_mask_counts(tmp_path):
    assert usable_cores(tmp_path) == len(os.sched_getaffinity(0))


def test_without_an_affinity_mask_every_core_counts(tmp_path, monkeypatch):
    # macOS: no sched_getaffinity, no cgroups.
    monkeypatch.delattr(os, "sched_getaffinity")
    assert usable_cores(tmp_path) == os.cpu_count()
