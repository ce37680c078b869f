"""amp=auto picks what runs fast where it runs, and says why; an explicit amp is obeyed."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import torch

from facebench.host import device
from facebench.host.device import resolve_precision

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


@pytest.fixture
def cpu_without_bf16(monkeypatch):
    monkeypatch.setattr(device, "native_bf16", lambda: False)


@pytest.fixture
def cpu_with_bf16(monkeypatch):
    monkeypatch.setattr(device, "native_bf16", lambda: True)


def test_auto_is_fp32_on_a_cpu_that_would_emulate_bf16(cpu_without_bf16):
    precision = resolve_precision("auto", CPU)
    assert precision.name == "fp32" and precision.dtype is None and not precision.scale_loss
    assert "no native bfloat16" in precision.reason and "amp=bf16 forces it" in precision.reason


def test_auto_is_bf16_on_a_cpu_that_computes_it(cpu_with_bf16):
    precision = resolve_precision("auto", CPU)
    assert precision.name == "bf16" and precision.dtype == torch.bfloat16
    assert "natively" in precision.describe()


def test_auto_is_fp16_with_a_grad_scaler_on_cuda(cpu_without_bf16):
    precision = resolve_precision("auto", CUDA)
    assert precision.name == "fp16" and precision.dtype == torch.float16 and precision.scale_loss


def test_forced_bf16_runs_but_warns_where_it_is_emulated(cpu_without_bf16, caplog):
    with caplog.at_level(logging.WARNING):
        precision = resolve_precision("bf16", CPU)
    assert precision.name == "bf16"
    assert "emulated, about 10x slower than amp=off" in caplog.text


def test_forced_bf16_where_it_is_native_says_nothing(cpu_with_bf16, caplog):
    with caplog.at_level(logging.WARNING):
        assert resolve_precision("bf16", CPU).name == "bf16"
    assert not caplog.text


def test_off_is_fp32_everywhere(cpu_with_bf16):
    assert resolve_precision("off", CPU).name == "fp32"
    assert resolve_precision("off", CUDA).name == "fp32"


@pytest.mark.slow  # a fresh interpreter: the ISA limit is read when torch loads
def test_a_cpu_limited_to_avx2_has_no_native_bf16():
    # oneDNN told to use AVX2 at most behaves as an AVX2-only CPU does.
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
    code = "from facebench.host.device import native_bf16; print(native_bf16())"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.stdout.strip() == "False", result.stderr[-2000:]
