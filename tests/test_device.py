"""SERVING_DEVICE / SERVING_DTYPE: resolved after fork, a missing GPU falls back to the CPU."""

from __future__ import annotations

import logging

import pytest

from serving_core.device import resolve, torch_dtype
from serving_core.loading import load_handler
from serving_core.settings import Settings, SettingsError

# torch is a handler's requirement, not the framework's (the tests of
# SERVING_DEVICE without it would be of nothing).
torch = pytest.importorskip("torch", reason="no handler here installs torch")

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


def test_cpu_is_the_default_and_never_asks_torch():
    assert Settings.from_env({}, cores=1).device == "cpu"
    assert resolve("cpu") == "cpu"


@pytest.mark.parametrize("value", ["cpu", "cuda", "cuda:0", "cuda:3", "auto", "CUDA"])
def test_devices_that_are_accepted(value):
    assert Settings.from_env({"SERVING_DEVICE": value}, cores=1).device == value.lower()


@pytest.mark.parametrize("value", ["gpu", "cuda:", "cuda:x", "mps:0", "tpu"])
def test_a_bad_device_names_the_variable_and_the_choices(value):
    with pytest.raises(SettingsError, match=r"SERVING_DEVICE=.*use cpu, cuda, cuda:N"):
        Settings.from_env({"SERVING_DEVICE": value}, cores=1)


def test_a_bad_dtype_names_the_choices():
    with pytest.raises(SettingsError, match="SERVING_DTYPE='half' is not one of: float32"):
        Settings.from_env({"SERVING_DTYPE": "half"}, cores=1)


def test_auto_takes_a_gpu_only_when_one_is_visible():
    assert resolve("auto") == ("cuda" if GPUS else "cpu")


@pytest.mark.skipif(GPUS > 0, reason="this machine has a GPU: nothing to fall back from")
@pytest.mark.parametrize("requested", ["cuda", "cuda:1"])
def test_a_missing_gpu_falls_back_to_the_cpu_with_a_warning(requested, caplog):
    with caplog.at_level(logging.WARNING, logger="serving_core.device"):
        assert resolve(requested) == "cpu"
    assert f"SERVING_DEVICE={requested}" in caplog.text
    assert "running on the CPU" in caplog.text


def test_half_precision_is_kept_for_gpus(caplog):
    with caplog.at_level(logging.WARNING, logger="serving_core.device"):
        assert torch_dtype("float16", "cpu") is torch.float32
    assert "SERVING_DTYPE=float16 ignored on the CPU" in caplog.text
    assert torch_dtype("bfloat16", "cuda") is torch.bfloat16
    assert torch_dtype("float32", "cpu") is torch.float32


@pytest.mark.example("echo")
def test_the_handler_sees_the_requested_device_before_setup():
    loaded = load_handler("handlers.echo.handler", device="cuda:1", dtype="float16")
    assert (loaded.handler.device, loaded.handler.dtype) == ("cuda:1", "float16")
